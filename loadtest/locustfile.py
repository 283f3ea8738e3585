"""Load-test a shardline gateway with locust, through the real gRPC client SDK.

    pip install -e ".[load]"
    locust -f loadtest/locustfile.py --host 127.0.0.1:50051 --headless -u 32 -r 8 -t 60s

Each simulated user streams completions back to back. Locust records two request types per call:
`ttft` (time to the first text delta) and `stream` (the whole completion, its size in tokens as
the response length), so its tables give time-to-first-token and end-to-end latency percentiles,
and `tokens` / second follows from the stream rows. Environment knobs: SHARDLINE_MODEL (default:
the only model served), SHARDLINE_MAX_TOKENS (64), SHARDLINE_TEMPERATURE (0.8).
"""

from __future__ import annotations

import os
import random
import time

import grpc.experimental.gevent as grpc_gevent
from locust import User, between, events, task

grpc_gevent.init_gevent()  # locust runs users as gevent greenlets; gRPC must cooperate or it blocks them

from shardline.client import Client, ShardlineError

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


class ShardlineUser(User):
    wait_time = between(0.0, 0.2)

    def on_start(self) -> None:
        self.client = Client(self.host)
        self.model = os.environ.get("SHARDLINE_MODEL", "")
        self.temperature = float(os.environ.get("SHARDLINE_TEMPERATURE", 0.8))
        self.max_tokens = self.environment.parsed_options.max_tokens if self.environment.parsed_options else 64

    def on_stop(self) -> None:
        self.client.close()

    def _fire(self, name: str, started: float, length: int, exc: Exception | None) -> None:
        self.environment.events.request.fire(request_type="grpc", name=name, response_time=(time.perf_counter() - started) * 1e3,
                                             response_length=length, exception=exc, context={})

    @task
    def stream_completion(self) -> None:
        started = time.perf_counter()
        tokens, first = 0, None
        try:
            for delta in self.client.stream(random.choice(PROMPTS), model=self.model, max_tokens=self.max_tokens,
                                            temperature=self.temperature, seed=random.randrange(1 << 30)):
                if first is None:
                    first = time.perf_counter()
                    self._fire("ttft", started, 0, None)
                tokens += len(delta.token_ids)
        except ShardlineError as e:
            self._fire("stream", started, tokens, e)
            return
        self._fire("stream", started, tokens, None)
