"""The decode step under the GPU's power limit: its time against what it computes on.

    python -m benchmarks.step_power [--batch 64] [--gemm-config T] [--seconds 10] [--no-decode]

A batch-64 decode step keeps an H200 at its board power limit, where the driver lowers the SM
clock until the draw fits (throttle reason "SW power cap"). How far it lowers it depends on what
the step computes on: the same kernels on other data draw other power. This script replays one
captured step (every row attending over 192 tokens, as decode_bench's "GPU step alone") and, after
~0.5 s of replays each time, prints its replay time beside the SM clock, the power draw and the
throttle reasons (nvidia-smi):

* with the KV cache as the engine built it (zeros) and token 0 in every row (a fresh graph's
  padding step), then with the cache filled with normal(0, 1) or zeros and token 0 in every row
  or a random token a row;
* after a decode_bench run of the batch (its ms/step printed too), at context 192 again, with the
  run's keys and values in the cache;
* with --seconds S: sampled over S seconds of back-to-back steps, then after rests of 2, 5, 10 s.

With --gemm-configs A,B (`tune-gemm` tables) it A/Bs the tables instead, alternated --rounds
times in one process (graphs recaptured, the KV cache normal(0, 1), a random token a row): each
one's steps sampled over --seconds (default 3) of load, then a line a table of its mean step,
SM clock, power draw and energy a step (W x ms). A kernel that saves bytes but spends more
arithmetic can lose at the power limit what it wins alone at the full clock.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch

from benchmarks import decode_bench, gpu_state
from benchmarks.gpu_state import SMI_FIELDS, smi
from shardline import step_tuning
from shardline.gemm_tuning import GemmTable

def clock_and_power() -> tuple[float, float]:
    """The SM clock (MHz) and the power draw (W) now; NaNs where they cannot be read."""
    r = gpu_state.read()
    return (r.sm_mhz, r.power_w) if r is not None else (float("nan"), float("nan"))


def table_ab(pipeline, tables: dict, batch: int, seconds: float, rounds: int) -> None:
    """Each table's captured step under load, the tables alternated `rounds` times: its replay
    time, SM clock and power sampled every ~0.2 s over `seconds`, then a line a table."""
    engine = pipeline.engines[0]
    vocab = pipeline.manifest.model.vocab_size
    print(f"{torch.cuda.get_device_name()}  {datetime.date.today().isoformat()}\n$ {' '.join(sys.argv)}")
    print(f"batch {batch}, context 192, KV cache normal(0, 1), a random token a row; {seconds:g} s of steps a table a round")
    samples: dict[str, list[tuple[float, float, float]]] = {path: [] for path in tables}
    for r in range(rounds):
        for path, table in tables.items():
            engine.model.configure_gemms(table)
            engine.graphs.reset()
            graph = decode_bench.loaded_graph(pipeline, batch, capture=True)
            for k, v in engine.kv_layers:
                k.normal_(0, 1)
                v.normal_(0, 1)
            engine.graphs.mailbox[:batch].copy_(torch.randint(0, vocab, (batch,)))
            for _ in range(100):  # ~0.5 s: the clock settles where the draw fits the limit
                graph.replay()
            t0, got = time.time(), []
            while time.time() - t0 < seconds:
                ms = step_tuning.replay_ms(graph, 40)
                got.append((ms, *clock_and_power()))
            samples[path] += got
            ms, mhz, w = (sum(g[i] for g in got) / len(got) for i in range(3))
            print(f"round {r + 1}  {path:<48} {ms:7.3f} ms  {mhz:6.0f} MHz  {w:6.1f} W  {w * ms:6.1f} mJ a step",
                  flush=True)
    print(f"\n| table | step ms | SM MHz | W | mJ a step |\n|---|---:|---:|---:|---:|")
    for path, got in samples.items():
        ms, mhz, w = (sum(g[i] for g in got) / len(got) for i in range(3))
        print(f"| {path} | {ms:.3f} | {mhz:.0f} | {w:.1f} | {w * ms:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--gemm-config", help="the engine's tune-gemm table")
    ap.add_argument("--seconds", type=float, default=0.0, help="also sample the step over this many seconds of load")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode run and the replay after it")
    ap.add_argument("--gemm-configs", type=decode_bench.table_paths,
                    help="A/B these tables (comma separated) under load instead: clock, power, energy a step")
    ap.add_argument("--rounds", type=int, default=2, help="with --gemm-configs: rounds of the tables alternated")
    args = ap.parse_args()
    if args.batch < 1 or args.seconds < 0 or args.rounds < 1:
        ap.error(f"--batch {args.batch}, --seconds {args.seconds}, --rounds {args.rounds}: a batch >= 1, "
                 "seconds >= 0, rounds >= 1")
    if not torch.cuda.is_available():
        ap.error("step_power times a captured decode step on a CUDA GPU; none is visible")
    if args.gemm_configs:
        tables = {path: GemmTable.load(path, torch.device("cuda")) for path in args.gemm_configs}
        if None in tables.values():
            ap.error(f"--gemm-configs: {[p for p, t in tables.items() if t is None]} tuned on another GPU than "
                     f"{torch.cuda.get_device_name()} (table_variant --gpu relabels a copy)")
        decode_bench.GEMM_CONFIG = args.gemm_configs[0]
        table_ab(decode_bench.build("llama3-8b", max_num_seqs=args.batch), tables, args.batch,
                 args.seconds or 3.0, args.rounds)
        return
    decode_bench.GEMM_CONFIG = args.gemm_config
    pipeline = decode_bench.build("llama3-8b", max_num_seqs=args.batch)
    engine = pipeline.engines[0]
    graph = decode_bench.loaded_graph(pipeline, args.batch, capture=True)
    print(f"{torch.cuda.get_device_name()}  {datetime.date.today().isoformat()}\n$ {' '.join(sys.argv)}")
    print(f"batch {args.batch}, context 192; nvidia-smi: {SMI_FIELDS}")

    def sample(label: str) -> None:
        for _ in range(100):  # ~0.5 s under load: the clock settles where the draw fits the limit
            graph.replay()
        ms = step_tuning.replay_ms(graph, 40)
        print(f"{label:<52}{ms:>8.3f} ms   {smi()}", flush=True)

    def fill_cache(fill) -> None:
        for k, v in engine.kv_layers:
            fill(k)
            fill(v)
        torch.cuda.synchronize()

    vocab = pipeline.manifest.model.vocab_size
    ids = engine.graphs.mailbox[:args.batch]  # the graph's host-id column, taken at each replay

    def tokens(diverse: bool) -> None:
        ids.copy_(torch.randint(0, vocab, (args.batch,)) if diverse else torch.zeros_like(ids))

    def normal(t: torch.Tensor) -> None:
        t.normal_(0, 1)

    sample("as built: KV cache zeros, token 0 in every row")
    for label, fill, diverse in (("KV cache normal(0, 1), token 0 in every row", normal, False),
                                 ("KV cache normal(0, 1), a random token a row", normal, True),
                                 ("KV cache zeros, a random token a row", torch.Tensor.zero_, True),
                                 ("KV cache zeros, token 0 in every row", torch.Tensor.zero_, False)):
        fill_cache(fill)
        tokens(diverse)
        sample(label)
    if not args.no_decode:
        ms = decode_bench.decode_ms_per_step(pipeline, args.batch)
        print(f"decode_bench ms/step (contexts 128-256): {ms:.3f}")
        graph = decode_bench.loaded_graph(pipeline, args.batch)  # context 192 again, token 0 in every row
        sample("after the decode run: its KV cache, token 0")
        tokens(True)
        sample("after the decode run: its KV cache, random tokens")
    if args.seconds:
        t0 = time.time()
        while time.time() - t0 < args.seconds:
            sample(f"after {time.time() - t0:4.1f} s of steps")
        for rest in (2, 5, 10):
            time.sleep(rest)
            sample(f"after a {rest} s rest")


if __name__ == "__main__":
    main()
