"""Gateway test bench (used by conftest.py and the tests): real Redis, the real tokenizer service,
and test-local stage-0 servicers (FakeStageWorker) over real gRPC sockets, all served from one
background asyncio loop; tests drive the gateway through the real client SDK.

FakeStageWorker stands in for the stage workers so that failures can be staged precisely (abort
after n tokens, stall, resend duplicates on resume). Its token at index i is a pure function of
(prompt, i), as the real engine's greedy output is, so a resumed stream must continue exactly.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import grpc

from benchmarks.gateway_capacity import generate_many_over
from shardline.gateway.config import AdmissionConfig, GatewayConfig
from shardline.gateway.server import start as start_gateway
from shardline.registry import Registry, ReplicaInfo
from shardline.v1 import common_pb2, stage_pb2, stage_pb2_grpc

SCRIPT_TEXT = "the quick brown fox jumps over the lazy dog. hello world, hello again. "


class LoopThread:
    """An asyncio loop on a daemon thread; run(coro) executes there and returns the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class FakeStageWorker(stage_pb2_grpc.StageWorkerServicer):
    def __init__(self, script: list[int], token_delay_s: float = 0.0) -> None:
        self.script, self.token_delay_s = script, token_delay_s
        self.admitted: list[stage_pb2.AdmitRequest] = []
        self.cancelled: list[str] = []  # streams the caller closed before they finished
        self.fail_after: int | None = None  # abort UNAVAILABLE after this many tokens (once)
        self.stall_after: int | None = None  # stop sending after this many tokens (once)
        self.resend = 0  # on a resume, send this many already-generated tokens again
        self.many_calls = 0  # GenerateMany streams that admitted something on this replica
        self.many_probes = 0  # GenerateMany streams closed before any message (the gateway's question)
        self.many_messages: list[int] = []  # items in each message those streams carried in
        self.older_version = False  # a replica from before GenerateMany: UNIMPLEMENTED, as gRPC answers it
        self.server: grpc.aio.Server | None = None
        self.address = ""

    def token_at(self, prompt: list[int], index: int) -> int:
        return self.script[(len(prompt) + index) % len(self.script)]

    async def start(self) -> None:
        self.server = grpc.aio.server()
        stage_pb2_grpc.add_StageWorkerServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.address = f"127.0.0.1:{port}"

    async def Generate(self, request, context):
        self.admitted.append(request)
        prompt, sampling = list(request.prompt_token_ids), request.sampling
        start = max(0, len(request.generated_token_ids) - self.resend)
        num_sent = 0
        try:
            for index in range(start, sampling.max_tokens):
                if self.fail_after is not None and num_sent >= self.fail_after:
                    self.fail_after = None
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "fake stage 0 is going down")
                if self.stall_after is not None and num_sent >= self.stall_after:
                    self.stall_after = None
                    await asyncio.sleep(3600)
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                token = self.token_at(prompt, index)
                finish = common_pb2.FINISH_REASON_UNSPECIFIED
                if token in sampling.stop_token_ids:
                    finish = common_pb2.FINISH_REASON_STOP
                elif index == sampling.max_tokens - 1:
                    finish = common_pb2.FINISH_REASON_LENGTH
                yield stage_pb2.TokenEvent(request_id=request.request_id, token_id=token, index=index,
                                           finish_reason=finish)
                num_sent += 1
                if finish:
                    return
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            raise

    async def GenerateMany(self, request_iterator, context):  # an async generator, as gRPC's aio server wants
        if self.older_version:
            self.many_probes += 1
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        carried = False

        async def counted():
            nonlocal carried
            async for message in request_iterator:
                if not carried:
                    carried, self.many_calls = True, self.many_calls + 1
                self.many_messages.append(len(message.items))
                yield message
            if not carried:
                self.many_probes += 1

        async for message in generate_many_over(self.Generate, counted(), context):
            yield message

    async def GetStatus(self, request, context):
        return stage_pb2.StageStatus(address=self.address)


class Bench:
    """One model's fake replicas registered in Redis, plus gateways started against them."""

    def __init__(self, loop: LoopThread, redis_url: str, tokenizer_address: str, script: list[int]) -> None:
        self.loop, self.redis_url, self.tokenizer_address, self.script = loop, redis_url, tokenizer_address, script
        self.registry = Registry.from_url(redis_url, ttl_s=60.0)
        self.replicas: dict[str, tuple[FakeStageWorker, ReplicaInfo]] = {}
        self.gateways = []

    def add_replica(self, model: str, stage: int, num_stages: int = 2, num_running: int = 0,
                    token_delay_s: float = 0.0, script: list[int] | None = None) -> FakeStageWorker:
        fake = FakeStageWorker(script or self.script, token_delay_s)
        self.loop.run(fake.start())
        info = ReplicaInfo(replica_id=f"fake-{uuid.uuid4().hex[:8]}", address=fake.address, model=model, stage=stage,
                           num_stages=num_stages, layer_start=stage, layer_end=stage + 1, tp=1,
                           num_total_blocks=64, num_free_blocks=64, block_size=16, num_running=num_running)
        self.registry.heartbeat(info)
        self.replicas[fake.address] = (fake, info)
        return fake

    def route(self, model: str, num_stage0: int = 1, **kw) -> tuple[list[FakeStageWorker], FakeStageWorker]:
        """num_stage0 stage-0 replicas (kw: their settings) and one stage-1 replica of `model`."""
        stage0 = [self.add_replica(model, 0, **kw) for _ in range(num_stage0)]
        return stage0, self.add_replica(model, 1)

    @staticmethod
    def wait_until(predicate, timeout_s: float = 10.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.02)

    def deregister(self, fake: FakeStageWorker) -> None:
        self.registry.deregister(self.replicas[fake.address][1])

    def kill(self, fake: FakeStageWorker) -> None:
        """The replica's process dies: its server goes away, its registry key stays until TTL."""
        self.loop.run(fake.server.stop(0))

    def start_gateway(self, **overrides):
        admission = overrides.pop("admission", AdmissionConfig(max_running=64, max_queued=64))
        settings = dict(redis_url=self.redis_url, tokenizer=self.tokenizer_address, port=0, host="127.0.0.1",
                        admission=admission, registry_ttl_s=1.0, registry_poll_s=0.1, route_wait_s=2.0)
        config = GatewayConfig(**{**settings, **overrides})
        running = self.loop.run(start_gateway(config))
        self.gateways.append(running)
        return running

    def close(self) -> None:
        for running in self.gateways:
            self.loop.run(running.stop(0))
        for fake, info in self.replicas.values():
            self.registry.deregister(info)
            self.loop.run(fake.server.stop(0))
