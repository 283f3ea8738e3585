"""python -m shardline.tokenizer --model DIR --address HOST:PORT"""

import argparse
import logging
from pathlib import Path

from .server import TokenizerServerConfig, run_tokenizer_process


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m shardline.tokenizer",
                                     description="Serve a model's tokenizer over gRPC (shardline.v1.Tokenizer).")
    parser.add_argument("--model", required=True, type=Path,
                        help="model directory holding tokenizer.json (and tokenizer_config.json)")
    parser.add_argument("--address", default=TokenizerServerConfig.address,
                        help="host:port to listen on; port 0 picks a free port (printed on start)")
    parser.add_argument("--grace-seconds", type=float, default=TokenizerServerConfig.grace_seconds,
                        help="on SIGTERM, how long open streams may take to finish")
    parser.add_argument("--log-level", default="INFO")
    return parser


def config_from_args(args: argparse.Namespace) -> TokenizerServerConfig:
    return TokenizerServerConfig(model_dir=args.model, address=args.address, grace_seconds=args.grace_seconds)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_tokenizer_process(config_from_args(args))


if __name__ == "__main__":
    main()
