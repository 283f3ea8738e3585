"""A Redis that stops answering: requests get UNAVAILABLE within the gateway's Redis timeout
instead of hanging, and the gateway serves again once Redis answers."""

from __future__ import annotations

import signal
import time

import pytest

from gateway_bench import SCRIPT_TEXT, Bench
from shardline.client import NO_RETRY, Client, Unavailable


def test_a_stopped_redis_gets_unavailable_not_a_hang(loop_thread, private_redis_server, tokenizer_service):
    proc, url = private_redis_server
    address, service = tokenizer_service
    bench = Bench(loop_thread, url, address, service.encode(SCRIPT_TEXT, add_special_tokens=False))
    try:
        bench.route("outage")
        gw = bench.start_gateway(model_names=("outage",), redis_timeout_s=0.5)
        with Client(f"127.0.0.1:{gw.port}", timeout=30, retry=NO_RETRY) as client:
            assert len(client.generate("hi", max_tokens=3).token_ids) == 3
            proc.send_signal(signal.SIGSTOP)  # alive, connected, silent: what a partition looks like
            start = time.monotonic()
            with pytest.raises(Unavailable) as e:
                client.generate("hi", max_tokens=3)
            assert time.monotonic() - start < 5, "the request must fail at the Redis timeout, not hang"
            assert "cannot record the request in Redis" in e.value.message and "retry later" in e.value.message
            proc.send_signal(signal.SIGCONT)
            assert len(client.generate("hi", max_tokens=3).token_ids) == 3, "served again once Redis answers"
    finally:
        proc.send_signal(signal.SIGCONT)
        bench.close()
