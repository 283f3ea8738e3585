"""Load-test a shardline gateway's OpenAI-compatible HTTP front door with locust.

    locust -f loadtest/http_locustfile.py --host http://127.0.0.1:8000 --headless -u 32 -r 8 -t 60s

The gateway must run with --http-port. Each simulated user streams /v1/completions (server-sent
events, `stream_options.include_usage`) back to back; the rows are those of locustfile.py
(`ttft`, `stream`), with request type `http`, so the two front doors compare row for row. The
response length of a `stream` row is the completion's token count from the usage event. Same
environment knobs as locustfile.py.
"""

from __future__ import annotations

import json
import random
import time

import requests
from locust import User, between, task

from common import PROMPTS, fire, settings


class StreamError(Exception):
    pass


class OpenAIHttpUser(User):
    wait_time = between(0.0, 0.2)

    def on_start(self) -> None:
        self.session = requests.Session()
        self.model, self.temperature, self.max_tokens = settings(self)

    def on_stop(self) -> None:
        self.session.close()

    @task
    def stream_completion(self) -> None:
        body = {"prompt": random.choice(PROMPTS), "max_tokens": self.max_tokens, "temperature": self.temperature,
                "seed": random.randrange(1 << 30), "stream": True, "stream_options": {"include_usage": True}}
        if self.model:
            body["model"] = self.model
        started = time.perf_counter()
        tokens, first = 0, None
        try:
            with self.session.post(f"{self.host}/v1/completions", json=body, stream=True, timeout=600) as r:
                if r.status_code != 200:
                    raise StreamError(f"HTTP {r.status_code}: {r.text[:200]}")
                for line in r.iter_lines():
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise StreamError(event["error"]["message"])
                    if first is None and event.get("choices"):  # the first delta, as the gRPC rows count it
                        first = time.perf_counter()
                        fire(self, "http", "ttft", started, 0, None)
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
        except (StreamError, requests.RequestException, ValueError) as e:
            fire(self, "http", "stream", started, tokens, e)
            return
        fire(self, "http", "stream", started, tokens, None)
