"""A tokenizer service that stops answering mid-request (alive, connected, silent: SIGSTOP): the
request gets UNAVAILABLE within the gateway's tokenizer timeout instead of hanging, and the
gateway serves again once the tokenizer answers."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import grpc
import pytest

from gateway_bench import SCRIPT_TEXT, Bench
from shardline.client import NO_RETRY, Client, Unavailable
from shardline.launcher import free_port


@pytest.fixture
def tokenizer_process(tokenizer_dir):
    """The real tokenizer service in a process of its own (so that it can be stopped); its address."""
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "shardline.tokenizer", "--model", str(tokenizer_dir),
                             "--address", address], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        grpc.channel_ready_future(grpc.insecure_channel(address)).result(timeout=30)
        yield proc, address
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)


def test_a_silent_tokenizer_mid_stream_gets_unavailable_not_a_hang(loop_thread, redis_server, tokenizer_service,
                                                                   tokenizer_process):
    proc, address = tokenizer_process
    _, service = tokenizer_service
    bench = Bench(loop_thread, redis_server, address, service.encode(SCRIPT_TEXT, add_special_tokens=False))
    try:
        bench.route("tok-outage", token_delay_s=0.05)
        gw = bench.start_gateway(model_names=("tok-outage",), tokenizer_timeout_s=0.5)
        with Client(f"127.0.0.1:{gw.port}", timeout=30, retry=NO_RETRY) as client:
            assert len(client.generate([5, 6, 7], max_tokens=3).token_ids) == 3  # the gateway knows the tokenizer
            stream = client.stream([5, 6, 7], max_tokens=40)
            next(iter(stream))  # the detokenize stream is open
            proc.send_signal(signal.SIGSTOP)
            start = time.monotonic()
            with pytest.raises(Unavailable) as e:
                list(stream)
            assert time.monotonic() - start < 5, "the request must fail at the tokenizer timeout, not hang"
            assert "did not answer a detokenize within" in e.value.message
            proc.send_signal(signal.SIGCONT)
            assert len(client.generate([5, 6, 7], max_tokens=3).token_ids) == 3, "served again"
    finally:
        proc.send_signal(signal.SIGCONT)
        bench.close()
