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
