"""How much of the engine's decode throughput survives the full serving path.

    python -m benchmarks.e2e_bench --shape llama3-8b --device cuda --batch 16          # issue 4's bar
    python -m benchmarks.e2e_bench --shape llama3-8b --device cuda --batch 16 \
        --gemm-config benchmarks/results/gemm-h200-decode.json                        # both on the tuned table
    python -m benchmarks.e2e_bench --shape llama3-8b --device cuda --batch 16,64,256   # and beyond it
    python -m benchmarks.e2e_bench --shape llama-small --device cpu --batch 16         # on a CPU
    python -m benchmarks.e2e_bench --shape llama3-8b --device cuda --batch 64 --gateways 1,2

One run, same random weights (model/random_weights.py); at each batch size, `batch` requests of
`prompt` random token ids and `new` greedy tokens each (ignore_eos):
  engine  - LocalPipeline in this process: every request at once, wall time of generate()
  served  - LocalCluster with --random-shape: Redis, tokenizer (a synthetic word-level tokenizer of
            the model's vocabulary), one stage worker, `--gateways` gateways (1; a list
            starts a cluster for each); `batch` concurrent streams, dealt in turn to one
            AsyncClient a gateway, connected before the clock starts
Prints tokens/s of each and served / engine (issue 4's bar: >= 0.9 at batch 16 on the GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import sys
import time

import grpc
import torch

from benchmarks import decode_bench
from benchmarks.decode_bench import build
from shardline.client import AsyncClient, RequestInfo
from shardline.config import KV_CACHE_DTYPES
from shardline.gemm_tuning import GemmTable
from benchmarks.gateway_capacity import cpu_seconds
from shardline.launcher import ClusterConfig, LocalCluster, free_port_run
from shardline.sampling import SamplingParams
from shardline.v1 import stage_pb2, stage_pb2_grpc


def engine_seconds(args, batches: list[int], prompts: dict[int, list[list[int]]], cuda: bool) -> dict[int, float]:
    """The fastest of two generate() walls at each batch, after a warm-up that compiles and captures."""
    pipeline = build(args.shape, dtype="bf16" if cuda else "fp32", max_num_seqs=max(*batches, 16),
                     device=args.device, kv_bytes=(16 << 30) if cuda else (512 << 20),
                     kv_cache_dtype=args.kv_cache_dtype)
    sampling = SamplingParams(max_tokens=args.new, ignore_eos=True)
    out = {}
    for b in batches:
        pipeline.generate(prompts[b], SamplingParams(max_tokens=4, ignore_eos=True))
        walls = []
        for _ in range(2):
            t = time.perf_counter()
            pipeline.generate(prompts[b], sampling)
            walls.append(time.perf_counter() - t)
        out[b] = min(walls)
    del pipeline
    if cuda:
        torch.cuda.empty_cache()
    return out


def served_rounds(args, cluster: LocalCluster, prompts: list[list[int]]) -> list[tuple]:
    """args.rounds rounds of len(prompts) concurrent streams: (wall, start, per-stream token
    arrival times, stage-0 steps, stage-0 busy seconds) each."""
    channel = grpc.insecure_channel(cluster.stage_addresses[0][0])
    stage0 = stage_pb2_grpc.StageWorkerStub(channel)
    pids = {"stage0": cluster.process("stage0-replica0-rank0").pid,
            "gateways": [p.pid for name, p in cluster.procs if name.startswith("gateway")]}

    def cpu() -> tuple[float, float]:
        """CPU seconds so far of stage 0's rank 0 and of the gateways together."""
        return cpu_seconds(pids["stage0"]), sum(cpu_seconds(pid) for pid in pids["gateways"])

    def counters() -> tuple[int, float]:
        c = stage0.GetStatus(stage_pb2.StatusRequest(), timeout=10).counters
        return c.num_steps, c.busy_seconds

    async def one(client: AsyncClient, p: list[int]) -> tuple[list[float], RequestInfo]:
        stamps = []
        stream = client.stream(p, model=cluster.model_name, max_tokens=args.new, temperature=0.0, ignore_eos=True)
        async for d in stream:
            stamps.extend([time.perf_counter()] * len(d.token_ids))
        assert len(stamps) == args.new, len(stamps)
        return stamps, await client.get_request(stream.request_id)

    async def run() -> list[tuple]:
        # One SDK client (one HTTP/2 connection, as a service calling shardline keeps), connected
        # before the clock starts: the round times the serving path, not connection set-up.
        clients = [AsyncClient(address) for address in cluster.gateway_addresses]
        try:
            burst = lambda: asyncio.gather(*(one(clients[i % len(clients)], p) for i, p in enumerate(prompts)))
            # Warm-up: one uncounted round of the same burst, so that every shape the rounds meet
            # (prefill chunks of however many requests land together) is compiled and cached first.
            await burst()
            rounds = []
            for _ in range(args.rounds):
                steps0, busy0 = counters()
                cpu0 = cpu()
                t, t_unix = time.perf_counter(), time.time()
                done = await burst()
                wall = max(s[-1] for s, _ in done) - t
                cpu1 = cpu()
                steps1, busy1 = counters()
                # the gateway's own stamps (unix time, this machine's clock), from the round's start
                gateway = [(info.queued_at - t_unix, info.first_token_at - t_unix) for _, info in done]
                rounds.append((wall, t, [s for s, _ in done], steps1 - steps0, busy1 - busy0, gateway,
                               (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1])))
            return rounds
        finally:
            for client in clients:
                await client.close()

    try:
        return asyncio.run(run())
    finally:
        channel.close()


def summary(batch: int, new: int, engine_s: float, rounds: list[tuple]) -> dict:
    served_s, t0, streams, _, _, gateway, _ = min(rounds, key=lambda r: r[0])
    gaps = [b - a for s in streams for a, b in zip(s, s[1:])]
    first = sorted(s[0] - t0 for s in streams)  # time to first token, from the round's start
    last = sorted(s[-1] - t0 for s in streams)
    spread = lambda xs: [round(1e3 * xs[0], 1), round(1e3 * xs[len(xs) // 2], 1), round(1e3 * xs[-1], 1)]
    tokens = batch * new
    return {"batch": batch, "engine_tok_s": round(tokens / engine_s, 1), "served_tok_s": round(tokens / served_s, 1),
            "served_over_engine": round(engine_s / served_s, 3),
            "served_ms_between_tokens": round(1e3 * sum(gaps) / max(len(gaps), 1), 2),
            "served_first_token_ms": spread(first), "served_last_token_ms": spread(last),
            # where the first token's time goes: the gateway accepts the request (queued), stage 0's
            # token reaches the gateway, the client gets it (after detokenizing and the stream)
            "gateway_queued_ms": spread(sorted(q for q, _ in gateway)),
            "gateway_first_token_ms": spread(sorted(f for _, f in gateway)),
            "served_rounds_s": [round(r[0], 3) for r in rounds],
            # stage 0's steps in each round, and the seconds it spent in them: a step count above
            # `new` + a few means arrivals split the batch; busy far below the round's wall means
            # the worker waited (on the network, the gateway), not the GPU
            "served_round_steps": [r[3] for r in rounds],
            "served_round_busy_s": [round(r[4], 3) for r in rounds],
            # CPU time of stage 0's process (its steps' host work, its token streams) and of the
            # gateways, per generated token, in each round (the process's whole CPU, every thread)
            "stage0_cpu_us_per_token": [round(1e6 * r[6][0] / tokens, 1) for r in rounds],
            "gateway_cpu_us_per_token": [round(1e6 * r[6][1] / tokens, 1) for r in rounds],
            # the fastest round's start on the monotonic clock the --trace step lines also use
            "served_round_t0": round(t0, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", default="16", help="comma list of batch sizes")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="served rounds per batch (after an uncounted "
                    "warm-up round); the fastest counts")
    ap.add_argument("--gateways", default="1", help="gateway processes, or a comma list (a cluster for "
                    "each); the streams are dealt among them (one carries ~10,000 tokens/s)")
    ap.add_argument("--workdir", help="keep the cluster's logs here (with --trace: a line per stage-0 step)")
    ap.add_argument("--trace", action="store_true", help="stage workers log at DEBUG: every step's rows and path")
    ap.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                    help="the engine's and the stage worker's KV cache: auto (the model's dtype) or fp8 (e4m3)")
    ap.add_argument("--gemm-config", help="a `shardline tune-gemm` table for the engine and the stage worker "
                    "alike (benchmarks/results/gemm-*-decode.json); without one both run the default GEMMs")
    ap.add_argument("--out")
    args = ap.parse_args()
    decode_bench.GEMM_CONFIG = args.gemm_config
    cuda = args.device.startswith("cuda")
    if args.gemm_config and cuda and GemmTable.load(args.gemm_config, torch.device(args.device)) is None:
        ap.error(f"--gemm-config {args.gemm_config}: no table of {torch.cuda.get_device_name(args.device)} there "
                 "(missing, or tuned on another GPU), so both sides would run the default GEMMs; give this GPU's "
                 "table (`shardline tune-gemm --out`) or leave it out")
    batches = [int(b) for b in args.batch.split(",")]
    g = torch.Generator().manual_seed(0)
    prompts = {b: torch.randint(3, 1000, (b, args.prompt), generator=g).tolist() for b in batches}
    engine_s = engine_seconds(args, batches, prompts, cuda)

    results = []
    for gateways in (int(n) for n in args.gateways.split(",")):
        workdir = f"{args.workdir}/gateways-{gateways}" if args.workdir else None
        config = ClusterConfig(random_shape=args.shape, pp=1, device=args.device, dtype="bf16" if cuda else "fp32",
                               grpc_port=free_port_run(gateways), gateways=gateways,
                               max_model_len=4096 if cuda else 1024, num_blocks=None if cuda else 2048,
                               startup_timeout_s=600, workdir=workdir, kv_cache_dtype=args.kv_cache_dtype,
                               gemm_config=args.gemm_config, extra_env={"SHARDLINE_LOG_LEVEL": "DEBUG"} if args.trace else {})
        with LocalCluster(config) as cluster:
            results += [{"gateways": gateways, **summary(b, args.new, engine_s[b], served_rounds(args, cluster, prompts[b]))}
                        for b in batches]
    res = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
           "device": torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine(),
           "shape": args.shape, "prompt": args.prompt, "new": args.new, "kv_cache_dtype": args.kv_cache_dtype,
           "gemm_config": args.gemm_config, "batches": results}
    print(json.dumps(res), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    print(f"\n{res['device']}  {res['date']}\n$ {res['command']}")
    for r in results:
        print(f"batch {r['batch']}, {r['gateways']} gateway{'s' if r['gateways'] > 1 else ''}: engine {r['engine_tok_s']} tok/s, served {r['served_tok_s']} tok/s "
              f"-> served/engine {r['served_over_engine']}{' (bar >= 0.9)' if r['batch'] == 16 else ''}\n"
              f"  first token at {r['served_first_token_ms']} ms (min, median, max from the round's start), "
              f"last at {r['served_last_token_ms']}; rounds {r['served_rounds_s']} s, stage-0 steps "
              f"{r['served_round_steps']}, busy {r['served_round_busy_s']} s\n"
              f"  CPU a token: stage 0 {r['stage0_cpu_us_per_token']} us, gateway {r['gateway_cpu_us_per_token']} us\n"
              f"  the gateway accepted them at {r['gateway_queued_ms']} ms and had their first tokens at "
              f"{r['gateway_first_token_ms']} ms")


if __name__ == "__main__":
    main()
