"""What the serving path costs on top of the engine: gateway + tokenizer + gRPC between stages.

    python benchmarks/transport_bench.py --concurrency 1,8,32 --max-tokens 32 [--device cpu] [--pp 2]

Runs the same tiny model (built on the spot) two ways in one run:
  engine  - LocalPipeline in this process: every stage, no network (activations still cross the
            stage boundary as bytes)
  served  - `LocalCluster`: real processes, Redis, tokenizer, stage workers over gRPC, the gateway;
            `concurrency` client streams at once through the SDK
and prints tokens/s and the per-token time of each, and the ratio. With a tiny model the engine's
compute is small, so this isolates the transport and service overhead; on a GPU with a real model
the same script measures how much of the engine's throughput survives the full path.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import platform
import sys
import time

from shardline.client import Client
from shardline.config import EngineConfig
from shardline.launcher import ClusterConfig, LocalCluster, free_port
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import LocalPipeline


def prompt_ids(i: int) -> list[int]:
    return [1] + [(7 * i + j) % 250 + 3 for j in range(15)]


def engine_run(model_dir, n: int, max_tokens: int, device: str) -> float:
    pipeline = LocalPipeline(model_dir, config=EngineConfig(device=device, num_blocks=512))
    prompts = [prompt_ids(i) for i in range(n)]
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    pipeline.generate(prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    t = time.perf_counter()
    out = pipeline.generate(prompts, sampling)
    elapsed = time.perf_counter() - t
    assert all(len(o) == max_tokens for o in out)
    return elapsed


def served_run(address: str, model: str, n: int, max_tokens: int) -> tuple[float, float]:
    """(wall seconds for n concurrent streams, mean seconds between tokens within a stream)."""
    def one(i: int) -> list[float]:
        with Client(address) as c:
            stamps = []
            for delta in c.stream(prompt_ids(i), model=model, max_tokens=max_tokens, temperature=0.0,
                                  ignore_eos=True):
                stamps.extend([time.perf_counter()] * len(delta.token_ids))
            assert len(stamps) == max_tokens, len(stamps)
            return [b - a for a, b in zip(stamps, stamps[1:])]

    t = time.perf_counter()
    with cf.ThreadPoolExecutor(n) as pool:
        gaps = [g for gs in pool.map(one, range(n)) for g in gs]
    return time.perf_counter() - t, sum(gaps) / max(len(gaps), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    config = ClusterConfig(pp=args.pp, tp=args.tp, device=args.device, grpc_port=free_port(), num_blocks=512,
                           dtype="bf16" if args.device.startswith("cuda") else "fp32")
    rows = []
    with LocalCluster(config) as cluster:
        for n in levels:
            engine_s = engine_run(cluster.model_dir, n, args.max_tokens, args.device)
            served_s, gap = served_run(cluster.gateway_address, cluster.model_name, n, args.max_tokens)
            tokens = n * args.max_tokens
            rows.append({"concurrency": n, "engine_tok_s": round(tokens / engine_s, 1),
                         "served_tok_s": round(tokens / served_s, 1),
                         "served_over_engine": round(engine_s / served_s, 3),
                         "engine_ms_per_step": round(engine_s / args.max_tokens * 1e3, 2),
                         "served_ms_between_tokens": round(gap * 1e3, 2)})
            print(json.dumps(rows[-1]), flush=True)
    res = {"date": datetime.date.today().isoformat(), "machine": f"{platform.processor() or platform.machine()}",
           "device": args.device, "command": " ".join(sys.argv), "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    print(f"\n{res['date']} {args.device} tp={args.tp} pp={args.pp} max_tokens={args.max_tokens}\n$ {res['command']}")
    print(f"{'streams':>7} {'engine tok/s':>12} {'served tok/s':>12} {'served/engine':>13} "
          f"{'engine ms/step':>14} {'served ms/token':>15}")
    for r in rows:
        print(f"{r['concurrency']:>7} {r['engine_tok_s']:>12} {r['served_tok_s']:>12} {r['served_over_engine']:>13} "
              f"{r['engine_ms_per_step']:>14} {r['served_ms_between_tokens']:>15}")


if __name__ == "__main__":
    main()
