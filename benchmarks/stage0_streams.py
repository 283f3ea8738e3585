"""What stage 0's process spends to stream tokens to a gateway: a Generate stream a sequence,
against one GenerateMany stream that carries them all.

    python -m benchmarks.stage0_streams --streams 64 --step-ms 5 --new 128 --rounds 3

The server is the real StageWorkerServicer (services/stage-worker/server.py) in a process of its
own, over a real gRPC socket, with `PacedFakeWorker` in place of the engine and scheduler: every
`step_ms` it puts one token event for each admitted sequence, in lockstep, as a decode step
does (64 streams at 5 ms offer 12,800 tok/s, an H200's batch-64 decode rate). The client admits
`streams` sequences one way or the other and reads every token. Compared, in alternated rounds:
the server process's CPU time per token, and how late the steps ran (on a stage worker the
servicer's threads take the GIL from the loop that schedules the next step; here, from the
fake's clock).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import queue
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc

from benchmarks.gateway_capacity import cpu_seconds
from shardline.launcher import free_port, wait_healthy
from shardline.sampling import SamplingParams
from shardline.stage_worker.convert import TokenEvent, sampling_to_proto
from shardline.stage_worker.sequence import FinishReason
from shardline.v1 import stage_pb2, stage_pb2_grpc


class PacedFakeWorker:
    """Stands in for StageWorker under the servicer: admits anything, and every step puts the
    next token of every running sequence on its events queue."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self._running: dict[int, list] = {}  # id(events) -> [request_id, events, next index, max_tokens]
        self._lock = threading.Lock()
        self.steps = 0
        self.late_s = 0.0  # summed over steps: how far past its due time each one ran
        threading.Thread(target=self._clock, daemon=True).start()

    def admit(self, request_id, prompt, sampling, route, generated, events=None):
        events = queue.Queue() if events is None else events
        with self._lock:
            self._running[id(events)] = [request_id, events, len(generated), sampling.max_tokens]
        return events

    def cancel(self, request_id, events=None) -> None:
        with self._lock:
            self._running.pop(id(events), None)

    def _clock(self) -> None:
        due = time.perf_counter()
        while True:
            due += self.step_s
            time.sleep(max(0.0, due - time.perf_counter()))
            now = time.perf_counter()
            with self._lock:
                running = list(self._running.items())
                if running:
                    self.steps += 1
                    self.late_s += max(0.0, now - due)
            for key, seq in running:
                rid, events, index, max_tokens = seq
                last = index == max_tokens - 1
                events.put(TokenEvent(rid, 7 + index, index, FinishReason.LENGTH if last else None))
                seq[2] += 1
                if last:
                    with self._lock:
                        self._running.pop(key, None)
            if not running:
                due = time.perf_counter()


class BenchServicer(stage_pb2_grpc.StageWorkerServicer):
    """GetStatus reports the fake's clock (steps, and their lateness as busy_seconds)."""

    def __init__(self, inner, fake: PacedFakeWorker) -> None:
        self.inner, self.fake = inner, fake
        self.Generate, self.GenerateMany = inner.Generate, inner.GenerateMany

    def GetStatus(self, request, context):
        return stage_pb2.StageStatus(counters=stage_pb2.StageCounters(num_steps=self.fake.steps,
                                                                      busy_seconds=self.fake.late_s))


def serve(port: int, step_s: float) -> None:
    from grpc_health.v1 import health, health_pb2_grpc

    from shardline.stage_worker.server import StageWorkerServicer

    fake = PacedFakeWorker(step_s)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=512))
    stage_pb2_grpc.add_StageWorkerServicer_to_server(BenchServicer(StageWorkerServicer(fake), fake), server)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


async def one_round(address: str, mode: str, streams: int, new: int) -> int:
    """Admit `streams` sequences of `new` tokens and read them all; returns the tokens read."""
    sampling = sampling_to_proto(SamplingParams(max_tokens=new, ignore_eos=True))
    admits = [stage_pb2.AdmitRequest(request_id=f"s{i}", prompt_token_ids=[1, 2, 3], sampling=sampling)
              for i in range(streams)]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = stage_pb2_grpc.StageWorkerStub(channel)
        if mode == "generate":
            async def read(admit) -> int:
                return sum([1 async for e in stub.Generate(admit) if e.HasField("token_id")])

            return sum(await asyncio.gather(*(read(a) for a in admits)))
        call = stub.GenerateMany()
        await call.write(stage_pb2.GenerateManyRequest(items=[stage_pb2.AdmitItem(sequence=i, admit=a)
                                                              for i, a in enumerate(admits)]))
        tokens, open_ = 0, set(range(streams))
        async for message in call:
            for item in message.items:
                tokens += item.event.HasField("token_id")
                if item.event.finish_reason:
                    open_.discard(item.sequence)
            if not open_:
                break
        await call.done_writing()
        return tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds of each mode")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server process
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args.step_ms / 1e3)

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.stage0_streams", "--serve", str(port),
                             "--step-ms", str(args.step_ms)])
    address = f"127.0.0.1:{port}"
    rows = []
    try:
        wait_healthy(address, 60, proc, "stage0_streams server")
        status = stage_pb2_grpc.StageWorkerStub(grpc.insecure_channel(address)).GetStatus
        asyncio.run(one_round(address, "many", args.streams, 8))  # warm both paths up
        asyncio.run(one_round(address, "generate", args.streams, 8))
        for _ in range(args.rounds):
            for mode in ("generate", "many"):
                before, cpu0, t = status(stage_pb2.StatusRequest()).counters, cpu_seconds(proc.pid), time.perf_counter()
                tokens = asyncio.run(one_round(address, mode, args.streams, args.new))
                wall, cpu1 = time.perf_counter() - t, cpu_seconds(proc.pid)
                after = status(stage_pb2.StatusRequest()).counters
                steps = after.num_steps - before.num_steps
                rows.append({"mode": mode, "tokens": tokens, "tok_s": round(tokens / wall, 1),
                             "server_cpu_us_per_token": round(1e6 * (cpu1 - cpu0) / tokens, 1),
                             "step_late_ms": round(1e3 * (after.busy_seconds - before.busy_seconds) / max(steps, 1), 3)})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    res = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
           "machine": platform.processor() or platform.machine(), "streams": args.streams, "step_ms": args.step_ms,
           "offered_tok_s": round(args.streams * 1e3 / args.step_ms, 1), "rounds": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    print(f"\n{res['machine']}  {res['date']}\n$ {res['command']}\noffered {res['offered_tok_s']} tok/s")
    for mode in ("generate", "many"):
        mine = [r for r in rows if r["mode"] == mode]
        print(f"{mode:>9}: delivered {[r['tok_s'] for r in mine]} tok/s, server CPU a token "
              f"{[r['server_cpu_us_per_token'] for r in mine]} us, steps late by {[r['step_late_ms'] for r in mine]} ms")


if __name__ == "__main__":
    main()
