"""How much of the engine's decode throughput survives the full serving path.

    python benchmarks/e2e_bench.py --shape llama3-8b --device cuda --batch 16      # issue 4's bar
    python benchmarks/e2e_bench.py --shape llama-small --device cpu --batch 16     # the same, on a CPU

One run, same random weights (model/random_weights.py), `batch` requests of `prompt` random token
ids and `new` greedy tokens each (ignore_eos):
  engine  - LocalPipeline in this process: every request at once, wall time of generate()
  served  - LocalCluster with --random-shape: Redis, tokenizer (a synthetic word-level tokenizer of
            the model's vocabulary), one stage worker, the gateway; `batch` concurrent streams of
            one AsyncClient, connected before the clock starts
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

from benchmarks.decode_bench import build
from shardline.client import AsyncClient
from shardline.v1 import stage_pb2, stage_pb2_grpc
from shardline.launcher import ClusterConfig, LocalCluster, free_port
from shardline.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="served rounds; the fastest counts")
    ap.add_argument("--workdir", help="keep the cluster's logs here (with --trace: a line per stage-0 step)")
    ap.add_argument("--trace", action="store_true", help="stage workers log at DEBUG: every step's rows and path")
    ap.add_argument("--out")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    dtype = "bf16" if cuda else "fp32"
    sampling = SamplingParams(max_tokens=args.new, ignore_eos=True)
    prompts = torch.randint(3, 1000, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0)).tolist()

    pipeline = build(args.shape, dtype=dtype, max_num_seqs=max(args.batch, 16), device=args.device,
                     kv_bytes=(8 << 30) if cuda else (256 << 20))
    pipeline.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up: compile, capture
    walls = []
    for _ in range(2):
        t = time.perf_counter()
        pipeline.generate(prompts, sampling)
        walls.append(time.perf_counter() - t)
    engine_s = min(walls)
    del pipeline
    if cuda:
        torch.cuda.empty_cache()

    config = ClusterConfig(random_shape=args.shape, pp=1, device=args.device, dtype=dtype, grpc_port=free_port(),
                           max_model_len=4096 if cuda else 1024, num_blocks=None if cuda else 512,
                           startup_timeout_s=600, workdir=args.workdir,
                           extra_env={"SHARDLINE_LOG_LEVEL": "DEBUG"} if args.trace else {})
    with LocalCluster(config) as cluster:
        channel = grpc.insecure_channel(cluster.stage_addresses[0][0])
        stage0 = stage_pb2_grpc.StageWorkerStub(channel)

        def counters() -> tuple[int, float]:
            c = stage0.GetStatus(stage_pb2.StatusRequest(), timeout=10).counters
            return c.num_steps, c.busy_seconds

        async def one(client: AsyncClient, p: list[int]) -> list[float]:
            """Arrival time of each token of one stream."""
            stamps = []
            async for d in client.stream(p, model=cluster.model_name, max_tokens=args.new, temperature=0.0,
                                         ignore_eos=True):
                stamps.extend([time.perf_counter()] * len(d.token_ids))
            assert len(stamps) == args.new, len(stamps)
            return stamps

        async def served_rounds() -> list[tuple]:
            # One SDK client (one HTTP/2 connection, as a service calling shardline keeps), connected
            # before the clock starts: the round times the serving path, not connection set-up.
            async with AsyncClient(cluster.gateway_address) as client:
                await one(client, prompts[0])  # warm-up through the whole path
                rounds = []
                for _ in range(args.rounds):
                    steps0, busy0 = counters()
                    t = time.perf_counter()
                    streams = await asyncio.gather(*(one(client, p) for p in prompts))
                    wall = time.perf_counter() - t
                    steps1, busy1 = counters()
                    rounds.append((wall, t, streams, steps1 - steps0, busy1 - busy0))
                return rounds

        rounds = asyncio.run(served_rounds())
        channel.close()
        served_s, t0, streams, _, _ = min(rounds, key=lambda r: r[0])
        gaps = [b - a for s in streams for a, b in zip(s, s[1:])]
        first = sorted(s[0] - t0 for s in streams)  # time to first token, from the round's start
        last = sorted(s[-1] - t0 for s in streams)
    tokens = args.batch * args.new
    res = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
           "device": torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine(),
           "shape": args.shape, "batch": args.batch, "prompt": args.prompt, "new": args.new,
           "engine_tok_s": round(tokens / engine_s, 1), "served_tok_s": round(tokens / served_s, 1),
           "served_over_engine": round(engine_s / served_s, 3),
           "served_ms_between_tokens": round(1e3 * sum(gaps) / max(len(gaps), 1), 2),
           "served_first_token_ms": [round(1e3 * first[0], 1), round(1e3 * first[len(first) // 2], 1),
                                     round(1e3 * first[-1], 1)],
           "served_last_token_ms": [round(1e3 * last[0], 1), round(1e3 * last[len(last) // 2], 1),
                                    round(1e3 * last[-1], 1)],
           "served_rounds_s": [round(r[0], 3) for r in rounds],
           # stage 0's steps in each round, and the seconds it spent in them: a step count above
           # `new` + a few means arrivals split the batch; busy far below the round's wall means
           # the worker waited (on the network, the gateway), not the GPU
           "served_round_steps": [r[3] for r in rounds],
           "served_round_busy_s": [round(r[4], 3) for r in rounds],
           # the fastest round's start on the monotonic clock the --trace step lines also use
           "served_round_t0": round(t0, 4)}
    print(json.dumps(res), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    print(f"\n{res['device']}  {res['date']}\n$ {res['command']}\n"
          f"batch {args.batch}: engine {res['engine_tok_s']} tok/s, served {res['served_tok_s']} tok/s "
          f"-> served/engine {res['served_over_engine']} (bar >= 0.9)\n"
          f"served streams: first token at {res['served_first_token_ms']} ms (min, median, max from the round's "
          f"start), last at {res['served_last_token_ms']}; rounds {res['served_rounds_s']} s, "
          f"stage-0 steps {res['served_round_steps']}, busy {res['served_round_busy_s']} s")


if __name__ == "__main__":
    main()
