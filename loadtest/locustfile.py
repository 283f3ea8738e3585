"""Load-test a shardline gateway with locust, through the real gRPC client SDK.

    pip install -e ".[load]"
    locust -f loadtest/locustfile.py --host 127.0.0.1:50051 --headless -u 32 -r 8 -t 60s

Each simulated user streams completions back to back. Locust records two request types per call:
`ttft` (time to the first text delta) and `stream` (the whole completion, its size in tokens as
the response length), so its tables give time-to-first-token and end-to-end latency percentiles,
and `tokens` / second follows from the stream rows. Environment knobs: SHARDLINE_MODEL (default:
the only model served), SHARDLINE_MAX_TOKENS (64), SHARDLINE_TEMPERATURE (0.8). The same load over
the OpenAI-compatible HTTP front door: `http_locustfile.py`.
"""

from __future__ import annotations

import random
import time

import grpc.experimental.gevent as grpc_gevent
from locust import User, between, task

grpc_gevent.init_gevent()  # locust runs users as gevent greenlets; gRPC must cooperate or it blocks them

from common import PROMPTS, fire, settings  # noqa: E402 - after gevent's init

from shardline.client import Client, ShardlineError  # noqa: E402


class ShardlineUser(User):
    wait_time = between(0.0, 0.2)

    def on_start(self) -> None:
        self.client = Client(self.host)
        self.model, self.temperature, self.max_tokens = settings(self)

    def on_stop(self) -> None:
        self.client.close()

    @task
    def stream_completion(self) -> None:
        started = time.perf_counter()
        tokens, first = 0, None
        try:
            for delta in self.client.stream(random.choice(PROMPTS), model=self.model, max_tokens=self.max_tokens,
                                            temperature=self.temperature, seed=random.randrange(1 << 30)):
                if first is None:
                    first = time.perf_counter()
                    fire(self, "grpc", "ttft", started, 0, None)
                tokens += len(delta.token_ids)
        except ShardlineError as e:
            fire(self, "grpc", "stream", started, tokens, e)
            return
        fire(self, "grpc", "stream", started, tokens, None)
