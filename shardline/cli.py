"""`shardline <command>`: one subcommand per module exposing `add_arguments(parser)` and `run(args) -> int`."""

from __future__ import annotations

import argparse
import importlib

# (name, module, help). Modules are imported only to build the parser; heavy imports belong in
# their `run`.
COMMANDS = [
    ("convert", "shardline.converter.cli", "convert a HuggingFace checkpoint into stage/rank shards"),
    ("up", "shardline.launcher", "run the whole system locally: Redis, tokenizer, stage workers, gateway"),
    ("tune-gemm", "shardline.gemm_tuning", "time GEMM candidates for a model's shapes on this GPU; write the choice"),
    ("generate", "shardline.stage_worker.cli", "run a converted model locally on token ids (every stage and rank)"),
    ("request", "shardline.client.cli", "send one request through a running gateway and print the completion"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module, help_text in COMMANDS:
        mod = importlib.import_module(module)
        command = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(command)
        command.set_defaults(run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
