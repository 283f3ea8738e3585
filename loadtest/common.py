"""What the two locustfiles share: the prompts, the --max-tokens option and the two request rows
(`ttft`, time to the first text delta; `stream`, the whole completion with its size in tokens as
the response length). Not a locustfile itself: it defines no User."""

from __future__ import annotations

import os
import time

from locust import events

PROMPTS = [
    "Write a short poem about pipelines.",
    "Explain tensor parallelism in one paragraph.",
    "안녕하세요, 오늘 날씨는 어때요?",
    "List three facts about GPUs 🙂",
    "Summarise: the gateway batches requests and keeps its metadata in Redis.",
]


@events.init_command_line_parser.add_listener
def _(parser):
    parser.add_argument("--max-tokens", type=int, default=int(os.environ.get("SHARDLINE_MAX_TOKENS", 64)))


def settings(user) -> tuple[str, float, int]:
    """(model, temperature, max_tokens) from the environment and the command line."""
    options = user.environment.parsed_options
    return (os.environ.get("SHARDLINE_MODEL", ""), float(os.environ.get("SHARDLINE_TEMPERATURE", 0.8)),
            options.max_tokens if options else 64)


def fire(user, request_type: str, name: str, started: float, length: int, exc: Exception | None) -> None:
    user.environment.events.request.fire(request_type=request_type, name=name,
                                         response_time=(time.perf_counter() - started) * 1e3,
                                         response_length=length, exception=exc, context={})
