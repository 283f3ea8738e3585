"""How many streamed tokens a second one gateway process can carry, with stage 0 not the limit.

    python -m benchmarks.gateway_capacity --streams 64 --step-ms 5 --new 128
    python -m benchmarks.gateway_capacity --streams 256 --new 1     # a burst of short requests

Everything is real (Redis, the tokenizer service with a synthetic word-level tokenizer of
Llama-3-8B's vocabulary, the gateway process, the SDK's AsyncClient) except stage 0, which is
`PacedFakeStage0`: it computes nothing and sends every running stream one token each `step_ms`,
in lockstep, as an engine's decode steps do. 64 streams at 5 ms offer 12,800 tok/s, what an H200
decodes Llama-3-8B at batch 64 (docs/benchmarks.md). The gateway is what is measured: tokens
delivered per second against tokens offered, its CPU time per token, the tokenizer's, and how
many tokens a chunk to the client carried (above 1 when the gateway falls behind and coalesces).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import time

import grpc
import redis
from grpc_health.v1 import health, health_pb2_grpc

from shardline.launcher import ClusterConfig, LocalCluster, free_port
from shardline.registry import Registry, ReplicaInfo
from shardline.v1 import common_pb2, stage_pb2, stage_pb2_grpc

VOCAB = 128256


class StreamAbort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _OneSequenceOfMany:
    """The context a fake's per-request Generate sees inside GenerateMany: its abort() ends the
    whole stream, as a stage 0 going down ends every sequence on it."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise StreamAbort(code, details)


async def generate_many_over(generate, request_iterator, context):
    """A fake stage 0's GenerateMany built on its per-request Generate (an async generator of
    TokenEvents): each admission runs as a task, a cancel item cancels it, and whatever events
    are ready go out in one message. When the client closes its side, the stream ends and what it
    left running is cancelled, as on the real stage 0."""
    out: asyncio.Queue = asyncio.Queue()
    tasks: dict[int, asyncio.Task] = {}

    async def run(item) -> None:
        try:
            async for event in generate(item.admit, _OneSequenceOfMany()):
                out.put_nowait(stage_pb2.TokenItem(sequence=item.sequence, event=event))
        except StreamAbort as e:
            out.put_nowait(e)

    async def read() -> None:
        async for message in request_iterator:
            for item in message.items:
                if item.cancel:
                    task = tasks.pop(item.sequence, None)
                    if task is not None:
                        task.cancel()
                else:
                    tasks[item.sequence] = asyncio.create_task(run(item))
        out.put_nowait(None)

    reader = asyncio.create_task(read())
    try:
        while True:
            items = [await out.get()]
            while not out.empty():
                items.append(out.get_nowait())
            ended = any(i is None for i in items)
            abort = next((i for i in items if isinstance(i, StreamAbort)), None)
            items = [i for i in items if isinstance(i, stage_pb2.TokenItem)]
            if items:
                yield stage_pb2.GenerateManyResponse(items=items)
            if abort is not None:
                await context.abort(abort.code, abort.details)
            if ended:
                return
    finally:
        reader.cancel()
        for task in tasks.values():
            task.cancel()


class PacedFakeStage0(stage_pb2_grpc.StageWorkerServicer):
    """Stage 0 without a model: each running stream gets one token per step, all in lockstep."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.streams: dict[str, asyncio.Queue] = {}

    async def clock(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            for q in list(self.streams.values()):
                q.put_nowait(None)

    async def Generate(self, request, context):
        tick: asyncio.Queue = asyncio.Queue()
        self.streams[request.request_id] = tick
        try:
            last = request.prompt_token_ids[-1]
            for index in range(len(request.generated_token_ids), request.sampling.max_tokens):
                await tick.get()
                done = index == request.sampling.max_tokens - 1
                yield stage_pb2.TokenEvent(request_id=request.request_id, token_id=(last + 7 * index) % VOCAB,
                                           index=index, finish_reason=common_pb2.FINISH_REASON_LENGTH if done
                                           else common_pb2.FINISH_REASON_UNSPECIFIED)
        finally:
            del self.streams[request.request_id]

    async def GenerateMany(self, request_iterator, context):  # an async generator, as gRPC's aio server wants
        async for message in generate_many_over(self.Generate, request_iterator, context):
            yield message


async def serve_fake_stage0(port: int, redis_url: str, model: str, step_s: float) -> None:
    fake = PacedFakeStage0(step_s)
    server = grpc.aio.server()
    stage_pb2_grpc.add_StageWorkerServicer_to_server(fake, server)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    registry = Registry.from_url(redis_url, ttl_s=5.0)
    info = ReplicaInfo(replica_id=f"paced-fake-{port}", address=f"127.0.0.1:{port}", model=model, stage=0,
                       num_stages=1, layer_start=0, layer_end=32, tp=1, num_total_blocks=1 << 20,
                       num_free_blocks=1 << 20, block_size=16)
    clock = asyncio.create_task(fake.clock())  # noqa: F841 - runs until the launcher stops this process
    while True:  # heartbeat, as a stage worker does
        info.num_running = len(fake.streams)
        registry.heartbeat(info)
        await asyncio.sleep(1.0)


class PacedFakeStageCluster(LocalCluster):
    """LocalCluster whose stage-0 replica is PacedFakeStage0 (in its own process)."""

    step_s = 0.005

    def _start_stage_replica(self, stage: int, replica: int):
        port = free_port()
        name = f"paced-fake-stage{stage}"
        proc = self._spawn(name, [sys.executable, "-m", "benchmarks.gateway_capacity", "--serve-fake-stage0",
                                  str(port), "--redis-url", self.redis_url, "--model", self.model_name,
                                  "--step-ms", str(1e3 * self.step_s)])
        address = f"127.0.0.1:{port}"
        self.stage_addresses[stage].append(address)
        return address, proc, name


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(args) -> dict:
    from shardline.client import AsyncClient

    PacedFakeStageCluster.step_s = args.step_ms / 1e3
    config = ClusterConfig(random_shape="llama3-8b", pp=1, grpc_port=free_port(), max_model_len=4096)
    with PacedFakeStageCluster(config) as cluster:
        pids = {name: p.pid for name, p in cluster.procs if name in ("gateway", "tokenizer")}
        redis_client = redis.Redis.from_url(cluster.redis_url)

        def transactions() -> int:  # MULTI/EXEC blocks Redis has run: the records' writes
            return redis_client.info("commandstats").get("cmdstat_exec", {}).get("calls", 0)

        async def rounds() -> tuple[float, int, int, dict, list[float]]:
            async with AsyncClient(cluster.gateway_address) as client:
                async def one(i: int) -> tuple[int, int, str]:
                    tokens = chunks = 0
                    stream = client.stream([3 + i] * 16, model=cluster.model_name, max_tokens=args.new,
                                           temperature=0.0, ignore_eos=True)
                    async for d in stream:
                        tokens += len(d.token_ids)
                        chunks += bool(d.token_ids)
                    assert tokens == args.new, tokens
                    return tokens, chunks, stream.request_id

                await one(0)
                before = {n: cpu_seconds(p) for n, p in pids.items()}
                exec_before = transactions()
                t, t_unix = time.perf_counter(), time.time()
                out = await asyncio.gather(*(one(i) for i in range(args.streams)))
                wall = time.perf_counter() - t
                cpu = {n: cpu_seconds(p) - before[n] for n, p in pids.items()}
                num_transactions = transactions() - exec_before
                # When the gateway accepted each request and had its first token (its record's
                # queued_at and first_token_at), after the clock
                records = [await client.get_request(o[2]) for o in out]
                accepted = [1e3 * (r.queued_at - t_unix) for r in records]
                first = [1e3 * (r.first_token_at - r.queued_at) for r in records]
                return (wall, sum(o[0] for o in out), sum(o[1] for o in out), cpu, sorted(accepted), num_transactions,
                        sorted(first))

        wall, tokens, chunks, cpu, accepted, num_transactions, first = asyncio.run(rounds())
    ideal_s = args.new * args.step_ms / 1e3  # every stream's tokens at the fake engine's pace
    return {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "streams": args.streams,
            "step_ms": args.step_ms, "new": args.new, "offered_tok_s": round(args.streams * 1e3 / args.step_ms),
            "delivered_tok_s": round(tokens / wall), "delivered_over_offered": round(ideal_s / wall, 3),
            "tokens_per_chunk": round(tokens / chunks, 2),
            "gateway_us_per_token": round(1e6 * cpu["gateway"] / tokens, 1),
            "gateway_ms_per_request": round(1e3 * cpu["gateway"] / args.streams, 2),
            # the burst's requests, all sent at once: when the gateway had accepted them
            "accepted_ms": [round(accepted[0], 1), round(accepted[len(accepted) // 2], 1), round(accepted[-1], 1)],
            # acceptance to the gateway's first token, each request: min, median, max
            "first_token_ms": [round(first[0], 1), round(first[len(first) // 2], 1), round(first[-1], 1)],
            "tokenizer_us_per_token": round(1e6 * cpu["tokenizer"] / tokens, 1),
            # the records' Redis transactions a request (batched across requests while one is in flight)
            "redis_transactions_per_request": round(num_transactions / args.streams, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=5.0, help="the fake engine's step: one token per stream")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out")
    ap.add_argument("--serve-fake-stage0", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--redis-url", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.streams < 1 or args.new < 1 or args.step_ms <= 0:
        ap.error(f"--streams {args.streams} and --new {args.new} must be >= 1, --step-ms {args.step_ms} > 0")
    if args.serve_fake_stage0:
        asyncio.run(serve_fake_stage0(args.serve_fake_stage0, args.redis_url, args.model, args.step_ms / 1e3))
        return
    res = measure(args)
    print(json.dumps(res), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    print(f"\n{res['machine']}  {res['date']}\n$ {res['command']}\n{args.streams} streams x {args.new} tokens, "
          f"a step every {args.step_ms} ms: offered {res['offered_tok_s']} tok/s, delivered "
          f"{res['delivered_tok_s']} ({res['delivered_over_offered']} of the pace); "
          f"{res['tokens_per_chunk']} tokens a chunk; gateway {res['gateway_us_per_token']} us CPU a token, "
          f"tokenizer {res['tokenizer_us_per_token']}; gateway {res['gateway_ms_per_request']} ms CPU a request, "
          f"all accepted by {res['accepted_ms'][2]} ms (median {res['accepted_ms'][1]}), first tokens "
          f"{res['first_token_ms']} ms after (min, median, max); "
          f"{res['redis_transactions_per_request']} Redis transactions a request")


if __name__ == "__main__":
    main()
