"""Parsers of the benchmarks' list options, shared by them and importable without a GPU or Triton."""

from __future__ import annotations

import argparse


def depths(text: str) -> list[int]:
    """--prefetch's and --ahead's value: comma-separated tile counts >= 0."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = [-1]
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected tile counts >= 0 separated by commas, e.g. 0,1,2,4; got {text!r}")
    return values


def pairs(text: str, second: str = "CONTEXT") -> list[tuple[int, int]]:
    """BATCHx<second> pairs, both >= 1, separated by commas: kernels_bench's --decode-shapes
    (second: CONTEXT), kv_dtype_ab's --cases (PROMPT)."""
    try:
        values = [tuple(int(v) for v in s.split("x")) for s in text.split(",")]
    except ValueError:
        values = []
    if not values or any(len(v) != 2 or min(v) < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected BATCHx{second} pairs separated by commas, e.g. 64x192,16x2048; "
                                         f"got {text!r}")
    return values


def decode_shapes(text: str) -> list[tuple[int, int]]:
    """--decode-shapes' value: BATCHxCONTEXT pairs."""
    return pairs(text, "CONTEXT")
