"""`shardline generate`: a quick look at a converted model, every stage and rank run locally."""

from __future__ import annotations

import argparse
import json
import sys

from shardline.config import ConfigError, EngineConfig, check_device
from shardline.manifest import Manifest
from shardline.sampling import SamplingParams


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids {text!r} must be comma-separated integers, e.g. 1,5,9")
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids is empty; give at least one token id")
    return ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="directory made by `shardline convert`")
    p.add_argument("--prompt-ids", required=True, type=_ids, help="comma-separated token ids, e.g. 1,5,9")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (the model's dtype) or fp8 (e4m3)")
    p.add_argument("--json", action="store_true", help='print {"token_ids": [...]}')


def run(args: argparse.Namespace) -> int:
    from shardline.stage_worker.pipeline import generate_local

    try:
        manifest = Manifest.read(args.model)
        vocab = manifest.model.vocab_size
        bad = [t for t in args.prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ConfigError(f"--prompt-ids {bad} outside the vocabulary; ids must be in 0..{vocab - 1}")
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                  seed=args.seed, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos)
        check_device(args.device, here=True)
        config = EngineConfig(device=args.device, kv_cache_dtype=args.kv_cache_dtype)
    except (ConfigError, ValueError) as e:
        print(f"shardline generate: error: {e}", file=sys.stderr)
        return 2
    tokens = generate_local(args.model, [args.prompt_ids], sampling, config)[0]
    print(json.dumps({"token_ids": tokens}) if args.json else " ".join(map(str, tokens)))
    return 0
