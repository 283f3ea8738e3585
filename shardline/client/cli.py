"""`shardline request`: one request through a running gateway, from the command line.

    shardline request --gateway llm-shardline-gateway:50051 "Hello"
    shardline request --gateway 127.0.0.1:50051 --max-tokens 8 --json "Hello"

Prints the completion's text (or, with --json, the result with its token ids, finish reason and
timings) and exits 0; an error from the gateway is printed as its gRPC code and message, exit 1.
The chart's `helm test` pod runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt's text")
    p.add_argument("--gateway", default="127.0.0.1:50051", help="host:port of a gateway's gRPC API")
    p.add_argument("--model", default="", help="the model to ask (default: the gateway's only model)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="generate --max-tokens tokens whatever comes")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for the whole request, retries included")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")


def run(args: argparse.Namespace) -> int:
    from .errors import ShardlineError
    from .sync import Client

    try:
        with Client(args.gateway, timeout=args.timeout) as client:
            result = client.generate(args.prompt, model=args.model, max_tokens=args.max_tokens,
                                     temperature=args.temperature, ignore_eos=args.ignore_eos)
    except (ShardlineError, ValueError) as e:
        print(f"shardline request: {e}", file=sys.stderr)
        return 1
    print(json.dumps(dataclasses.asdict(result)) if args.json else result.text)
    return 0
