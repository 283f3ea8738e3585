"""`shardline convert`: argument parsing and exit codes around `convert()`."""

from __future__ import annotations

import argparse
import sys

from shardline.config import DTYPES, ConfigError
from shardline.converter.convert import convert


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hf", required=True, help="HuggingFace checkpoint directory (config.json + weights)")
    parser.add_argument("--out", required=True, help="directory to write the converted model into")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per stage (default 1)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages (default 1)")
    # Validated by convert() rather than argparse `choices`, so a bad value gets the same
    # one-line error as every other bad input.
    parser.add_argument("--dtype", default="bf16",
                        help=f"weight and activation dtype: {', '.join(DTYPES)} (default bf16)")
    quant = parser.add_mutually_exclusive_group()
    quant.add_argument("--int8-weight-only", action="store_true",
                       help="store *_proj weights as int8 with per-output-channel scales")
    quant.add_argument("--fp8-weight-only", action="store_true",
                       help="store *_proj weights as fp8 (e4m3) with per-output-channel scales")
    parser.add_argument("--stage-layers", default=None,
                        help="layers per stage, comma-separated, e.g. 10,12,10 (default: as even as possible)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")


def parse_stage_layers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"--stage-layers {text!r} must be comma-separated layer counts, e.g. 10,12,10") from None


def run(args: argparse.Namespace) -> int:
    try:
        manifest = convert(args.hf, args.out, tp=args.tp, pp=args.pp, dtype=args.dtype,
                           quantization="int8-weight-only" if args.int8_weight_only else
                           "fp8-weight-only" if args.fp8_weight_only else "none",
                           stage_layers=parse_stage_layers(args.stage_layers), overwrite=args.overwrite)
    except ConfigError as e:
        print(f"shardline convert: error: {e}", file=sys.stderr)
        return 2
    m = manifest.model
    size = sum(s.bytes for s in manifest.shards)
    print(f"wrote {args.out}: {m.architecture}, {m.num_layers} layers, tp={manifest.tp} pp={manifest.pp}, "
          f"{manifest.dtype} ({manifest.quantization}), {len(manifest.shards)} shards, {size / 2**20:.1f} MiB")
    return 0
