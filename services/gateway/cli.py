"""`python -m shardline.gateway`: the gateway's command line, turned into a GatewayConfig once."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from redis.exceptions import RedisError

from shardline.config import ConfigError

from .config import AdmissionConfig, GatewayConfig


def _pairs(values: list[str], flag: str, cast=str) -> dict:
    out = {}
    for v in values:
        name, sep, value = v.partition("=")
        if not sep or not name:
            raise ConfigError(f"{flag} {v!r} must be MODEL=VALUE")
        try:
            out[name] = cast(value)
        except ValueError:
            raise ConfigError(f"{flag} {v!r}: {value!r} is not a valid {cast.__name__}") from None
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m shardline.gateway",
                                description="shardline gateway: the public gRPC (and OpenAI HTTP) API")
    p.add_argument("--port", type=int, default=50051, help="gRPC port (0 = any free port)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=None, help="OpenAI-compatible HTTP port; off if not given")
    p.add_argument("--redis-url", required=True, help="e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--tokenizer", action="append", default=[], required=True,
                   help="tokenizer service HOST:PORT for every model, or MODEL=HOST:PORT (repeatable)")
    p.add_argument("--model-name", action="append", default=[],
                   help="serve only this model (repeatable); default: every model in the registry")
    p.add_argument("--max-model-len", action="append", default=[],
                   help="MODEL=TOKENS context length when the registry does not say (repeatable)")
    p.add_argument("--model-dir", action="append", default=[],
                   help="[MODEL=]DIR converted model directory; its manifest gives the context length "
                        "(without MODEL=: the one --model-name, else the directory's name)")
    p.add_argument("--max-running", type=int, default=AdmissionConfig.max_running)
    p.add_argument("--max-queued", type=int, default=AdmissionConfig.max_queued)
    p.add_argument("--default-max-tokens", type=int, default=GatewayConfig.default_max_tokens)
    p.add_argument("--record-ttl", type=float, default=GatewayConfig.record_ttl_s,
                   help="seconds a finished request's record stays in Redis")
    p.add_argument("--registry-ttl", type=float, default=GatewayConfig.registry_ttl_s,
                   help="the stage workers' heartbeat TTL in seconds")
    p.add_argument("--route-wait", type=float, default=GatewayConfig.route_wait_s,
                   help="seconds to wait for a complete route before UNAVAILABLE")
    p.add_argument("--max-resumes", type=int, default=GatewayConfig.max_resumes)
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port (default: off)")
    p.add_argument("--http-idle-timeout", type=float, default=GatewayConfig.http_idle_timeout_s,
                   help="seconds an HTTP connection may go without a complete request head before it is closed")
    p.add_argument("--tokenizer-timeout", type=float, default=GatewayConfig.tokenizer_timeout_s,
                   help="seconds a tokenizer call or detokenize message may take before the request gets UNAVAILABLE")
    p.add_argument("--redis-timeout", type=float, default=GatewayConfig.redis_timeout_s,
                   help="seconds a Redis command may take before the request gets UNAVAILABLE")
    p.add_argument("--log-level", default="INFO")
    return p


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    default = [t for t in args.tokenizer if "=" not in t]
    if len(default) > 1:
        raise ConfigError(f"--tokenizer given {len(default)} times without MODEL=; give one default address")
    model_dirs = _pairs([d for d in args.model_dir if "=" in d], "--model-dir")
    for d in (d for d in args.model_dir if "=" not in d):
        model_dirs[args.model_name[0] if len(args.model_name) == 1 else Path(d).resolve().name] = d
    return GatewayConfig(
        redis_url=args.redis_url, tokenizer=default[0] if default else "",
        model_tokenizers=_pairs([t for t in args.tokenizer if "=" in t], "--tokenizer"),
        model_names=tuple(args.model_name), model_dirs=model_dirs, max_model_len=_pairs(args.max_model_len, "--max-model-len", int),
        admission=AdmissionConfig(max_running=args.max_running, max_queued=args.max_queued),
        host=args.host, port=args.port, http_port=args.http_port, default_max_tokens=args.default_max_tokens,
        record_ttl_s=args.record_ttl, registry_ttl_s=args.registry_ttl, route_wait_s=args.route_wait,
        max_resumes=args.max_resumes, redis_timeout_s=args.redis_timeout,
        http_idle_timeout_s=args.http_idle_timeout, metrics_port=args.metrics_port,
        tokenizer_timeout_s=args.tokenizer_timeout)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except ConfigError as e:
        print(f"shardline gateway: error: {e}", file=sys.stderr)
        return 2
    from .server import serve

    try:
        serve(config, ready=lambda running: print(f"gateway ready on port {running.port}"
                                                  + (f", HTTP {running.http_port}" if running.http_port else ""),
                                                  flush=True))
    except ConfigError as e:
        print(f"shardline gateway: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a port in use
        print(f"shardline gateway: error: {e}", file=sys.stderr)
        return 1
    except RedisError as e:
        print(f"shardline gateway: error: cannot reach Redis at {config.redis_url} ({e}); start it or fix "
              "--redis-url", file=sys.stderr)
        return 1
    return 0
