"""The KV cache in the model's dtype (bf16) against fp8 (e4m3), in one process: speed and capacity.

    python -m benchmarks.kv_dtype_ab [--cases 64x128,16x128,64x1024,16x2048] [--gemm-config T] [--rounds 2]

Two engines on random Llama-3-8B weights, one a cache type, both resident. Each case BxP is B
prompts of P tokens and 128 new ones; a round times, for each engine in turn (the first of the
two alternates round by round):

* the decode loop: decode_bench's ms/step, (t(128 new) - t(1 new)) / 127;
* the captured decode graph replayed back to back, every row attending over P + 64 tokens (the
  loop's mean context), 50 replays after 50 unmeasured ones.

The e4m3 cache halves the K/V a step reads (8.4 MB a token of context at 64 rows in bf16); the
weights are read as before, so at most that traffic can move (attention over e4m3 also widens
every element, which costs time of its own: docs/benchmarks.md). Capacity is what
a stage worker plans for the model alone on this GPU (gpu_memory_fraction 0.9), in sequences of
2,048 tokens. The batch-64 bar of issue 4 is a bf16 model's with a bf16 cache; this is not it.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys

import torch

from benchmarks import decode_bench
from benchmarks.arguments import pairs
from shardline import step_tuning
from shardline.config import ModelConfig
from shardline.model.random_weights import SHAPES
from shardline.stage_worker.kv_cache import bytes_per_block

KINDS = ("auto", "fp8")
NEW = 128


def cases(text: str) -> list[tuple[int, int]]:
    """--cases' value: BATCHxPROMPT pairs, each prompt and its 128 new tokens within the engines'
    4,096 positions."""
    values = pairs(text, "PROMPT")
    if any(p + NEW > 4096 for _, p in values):
        raise argparse.ArgumentTypeError(f"a prompt and its {NEW} new tokens must fit 4,096 positions; got {text!r}")
    return values


def replay_ms(pipeline, batch: int, context: int, replays: int = 50) -> float:
    graph = decode_bench.loaded_graph(pipeline, batch, context, capture=True)
    step_tuning.replay_ms(graph, replays)  # settle: the first replays after a decode run are slower
    return step_tuning.replay_ms(graph, replays)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=cases, default=cases("64x128,16x128,64x1024,16x2048"))
    ap.add_argument("--gemm-config", help="the engines' tune-gemm table")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each timing both engines once a case")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least 1")
    if not torch.cuda.is_available():
        ap.error("kv_dtype_ab times decode steps on a CUDA GPU; none is visible")
    decode_bench.GEMM_CONFIG = args.gemm_config
    print(f"{torch.cuda.get_device_name()}  {datetime.date.today().isoformat()}\n$ {' '.join(sys.argv)}", flush=True)
    capacity = {kind: decode_bench.kv_capacity_2k("llama3-8b", dtype)  # before this process holds anything
                for kind, dtype in zip(KINDS, (torch.bfloat16, torch.float8_e4m3fn))}
    batch_max = max(b for b, _ in args.cases)
    tokens = max(b * (p + NEW + 16) for b, p in args.cases)
    cfg = ModelConfig(**SHAPES["llama3-8b"])
    per_token = bytes_per_block(cfg.num_layers, 1, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
    kv_bytes = max(8 << 30, tokens * per_token + (1 << 30))  # each engine's: the fp8 one fits twice the tokens
    pipelines = {kind: decode_bench.build("llama3-8b", max_num_seqs=batch_max, kv_bytes=kv_bytes, kv_cache_dtype=kind)
                 for kind in KINDS}
    for kind, p in pipelines.items():
        print(f"{kind}: KV cache {p.engines[0].kv_cache.k.dtype}, {p.engines[0].block_manager.num_blocks} blocks",
              flush=True)
    times: dict[tuple, list[float]] = {}
    for r in range(args.rounds):
        order = KINDS if r % 2 == 0 else KINDS[::-1]
        for b, p in args.cases:
            for kind in order:
                decode = decode_bench.decode_ms_per_step(pipelines[kind], b, prompt=p, new=NEW)
                replay = replay_ms(pipelines[kind], b, p + NEW // 2)
                times.setdefault((b, p, kind, "decode"), []).append(decode)
                times.setdefault((b, p, kind, "replay"), []).append(replay)
                print(f"round {r + 1} {b}x{p} {kind}: decode {decode:.4f} ms, replay {replay:.4f} ms", flush=True)
    print(f"\nms a step: the mean over {args.rounds} round(s) (each cache first in every other one); tok/s of "
          f"the decode loop; fp8/auto")
    print(f"{'case':>9} {'what':>7} {'auto':>8} {'fp8':>8} {'fp8/auto':>8} {'tok/s auto':>10} {'tok/s fp8':>10}")
    for b, p in args.cases:
        for what in ("decode", "replay"):
            a, f = (statistics.fmean(times[(b, p, kind, what)]) for kind in KINDS)
            rates = f"{b * 1e3 / a:>10.0f} {b * 1e3 / f:>10.0f}" if what == "decode" else ""
            print(f"{f'{b}x{p}':>9} {what:>7} {a:>8.4f} {f:>8.4f} {f / a:>8.3f} {rates}")
    print(f"KV capacity, Llama-3-8B alone on this GPU (0.9 of memory): {capacity['auto']} sequences of 2,048 tokens "
          f"in bf16, {capacity['fp8']} in fp8 ({capacity['fp8'] / max(capacity['auto'], 1):.2f}x)")


if __name__ == "__main__":
    main()
