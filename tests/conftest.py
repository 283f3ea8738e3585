"""Fixtures shared across the test tree. Append new fixtures; do not rewrite others' ones."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from shardline.launcher import free_port
from shardline.tiny import make_tiny_hf_model


def start_redis_server() -> tuple[subprocess.Popen, str]:
    """A real redis-server on a free port, no persistence: (its process, redis://127.0.0.1:PORT/0)."""
    from shardline.launcher import redis_server_binary

    binary = redis_server_binary()  # no skip: the suite is about real Redis; scripts/setup.sh installs it
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def stop_redis_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGCONT)  # a test may have left it stopped
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server shared by the session; yields its URL (redis://127.0.0.1:PORT/0).

    Tests that share it must use distinct keys (model names, request ids) or flush what they own.
    """
    proc, url = start_redis_server()
    yield url
    stop_redis_server(proc)


@pytest.fixture
def private_redis_server():
    """A redis-server of this test's own, for tests that stop or kill it; yields (process, URL)."""
    proc, url = start_redis_server()
    yield proc, url
    stop_redis_server(proc)


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """`tiny_hf(family="llama", **make_tiny_hf_model_kwargs) -> Path`, built once per session per
    distinct arguments; treat the directory as read-only."""
    cache: dict[str, Path] = {}

    def make(family: str = "llama", **kwargs) -> Path:
        key = repr((family, sorted(kwargs.items())))
        if key not in cache:
            cache[key] = make_tiny_hf_model(tmp_path_factory.mktemp(f"hf-{family}"), family, **kwargs)
        return cache[key]

    return make
