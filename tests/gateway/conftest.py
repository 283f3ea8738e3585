"""Fixtures of the gateway tests; the bench itself (fakes, loop thread) is in gateway_bench.py."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from gateway_bench import SCRIPT_TEXT, Bench, LoopThread


@pytest.fixture(scope="session")
def loop_thread():
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from shardline.tiny import write_tiny_tokenizer

    directory = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(directory, vocab_size=301, max_length=256)
    return directory


@pytest.fixture(scope="session")
def tokenizer_service(loop_thread, tokenizer_dir):
    """The real tokenizer gRPC service (in-process, real socket); yields (address, TokenizerService)."""
    from shardline.tokenizer.server import TokenizerServerConfig, start_server
    from shardline.tokenizer.service import TokenizerService

    server, _, port = loop_thread.run(start_server(TokenizerServerConfig(model_dir=tokenizer_dir,
                                                                         address="127.0.0.1:0")))
    yield f"127.0.0.1:{port}", TokenizerService(tokenizer_dir)
    loop_thread.run(server.stop(0))


@pytest.fixture
def bench(loop_thread, redis_server, tokenizer_service):
    address, service = tokenizer_service
    b = Bench(loop_thread, redis_server, address, service.encode(SCRIPT_TEXT, add_special_tokens=False))
    yield b
    b.close()


@pytest.fixture
def model_name() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"
