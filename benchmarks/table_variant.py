"""A copy of a GEMM table with some entries replaced: the variants an in-step A/B compares.

    python -m benchmarks.table_variant --gemm-config benchmarks/results/gemm-h200-decode.json \
        --set 'o_proj@64={"impl": "ring", "config": {"BLOCK_N": 128, "BLOCK_K": 128, "STAGES": 4, "SPLIT_K": 4}}' \
        --out o1.json
    python -m benchmarks.profile_decode --batch 64 --timeline --gemm-config o1.json
    python -m benchmarks.table_variant --gemm-config o1.json --gpu "NVIDIA H100 80GB HBM3" --out o1-h100.json

`--set` (repeatable) names a Llama-3-8B linear (or another shape's, `--shape`) and a batch, and
gives the entry that `shardline tune-gemm` would write there; the table keeps its GPU name, so
the engine loads it where it loads the original. Nothing is checked against the kernels here: a
config that cannot run fails when the step is captured, with the kernel's own message.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from shardline.config import ModelConfig
from shardline.gemm_tuning import key, linear_shapes
from shardline.model.random_weights import SHAPES

LINEARS = ("qkv_proj", "o_proj", "up_proj", "down_proj", "lm_head")


def linear_key(shape: str, linear: str) -> str:
    """The table's key of `linear` in model `shape` at bf16 (gemm_tuning's 'NxK:bfloat16:bfloat16')."""
    n, k = linear_shapes(ModelConfig(**SHAPES[shape]))[linear]
    return key(n, k, torch.bfloat16, torch.bfloat16)


def parse_set(text: str, shape: str) -> tuple[str, str, dict]:
    """'linear@batch=JSON' -> (table key, batch, entry); ValueError naming what is wrong."""
    target, sep, entry = text.partition("=")
    linear, at, batch = target.partition("@")
    if not sep or not at or linear not in LINEARS or not batch.isdigit() or int(batch) < 1:
        raise ValueError(f"--set {text!r}: write LINEAR@BATCH=JSON, LINEAR one of {', '.join(LINEARS)} and "
                         "BATCH a positive integer")
    try:
        value = json.loads(entry)
    except json.JSONDecodeError as e:
        raise ValueError(f"--set {text!r}: the entry is not JSON ({e})") from None
    if not isinstance(value, dict) or "impl" not in value:
        raise ValueError(f'--set {text!r}: the entry is an object with an "impl" (and its "config"), as '
                         "tune-gemm writes it")
    return linear_key(shape, linear), batch, value


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gemm-config", required=True, help="the table to copy")
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--set", action="append", default=[], dest="sets", help="LINEAR@BATCH=JSON entry")
    ap.add_argument("--gpu", help="the GPU name the copy is for, if not the table's (an A/B of the same choices on "
                                  "another card, which loads a table only under its own name)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not args.sets and not args.gpu:
        ap.error("give --set LINEAR@BATCH=JSON (repeatable), --gpu NAME, or both: else the copy is the table")
    try:
        changes = [parse_set(s, args.shape) for s in args.sets]
    except ValueError as e:
        ap.error(str(e))
    try:
        with open(args.gemm_config) as f:
            table = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        ap.error(f"--gemm-config {args.gemm_config}: cannot read a table ({e})")
    for key, batch, entry in changes:
        table.setdefault("entries", {}).setdefault(key, {})[batch] = entry
    if args.gpu:
        table["gpu"] = args.gpu
    with open(args.out, "w") as f:
        json.dump(table, f, indent=1)
    print(f"wrote {args.out}: {len(changes)} entries of {args.gemm_config} replaced", file=sys.stderr)


if __name__ == "__main__":
    main()
