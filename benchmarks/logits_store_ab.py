"""Does skipping the head's logits in an all-greedy decode step pay? An A/B in one process.

    python -m benchmarks.logits_store_ab [--batch 64] [--gemm-config T] [--rounds 4] [--replay-rounds 12]

A decode graph reads one word of its step, "logits wanted" (cuda_graphs.StepLayout): where it is
0, a head that leaves the greedy ids from its epilogue (the split-K kernel, a table's choice at
2-64 rows, whether the layers fold their norms or not) does not write the fp32 logits, 33 MB a
step for Llama-3 at 64 rows. This times the
same engine and the same captured graph both ways, alternated round by round:

* the graph replayed back to back (every row attending over 192 tokens) with the word at 1
  (write) and at 0 (skip), 50 replays after 50 unmeasured ones, --replay-rounds times;
* the decode loop (decode_bench's ms/step, 128 + 128 tokens, greedy), as it runs (skip) and with
  every step told that it reads its logits (write), as a step with a row at a temperature is.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys

import torch

from benchmarks import decode_bench
from shardline import step_tuning


def replay_ms(pipeline, batch: int, wanted: int, replays: int = 50) -> float:
    graph = decode_bench.loaded_graph(pipeline, batch, capture=True, needs_logits=bool(wanted))
    step_tuning.replay_ms(graph, replays)  # settle: the first replays after a decode run are slower
    return step_tuning.replay_ms(graph, replays)


def decode_ms(pipeline, batch: int, write: bool) -> float:
    engine = pipeline.engines[0]
    prepare = type(engine)._prepare

    def told_to_write(batch_):
        step = prepare(engine, batch_)
        step.needs_logits = True
        return step

    if write:
        engine._prepare = told_to_write
    try:
        return decode_bench.decode_ms_per_step(pipeline, batch)
    finally:
        engine.__dict__.pop("_prepare", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--gemm-config", help="the engine's tune-gemm table (its head entry at the batch must be the split-K kernel)")
    ap.add_argument("--rounds", type=int, default=4, help="decode loops of each kind")
    ap.add_argument("--replay-rounds", type=int, default=12, help="replay timings of each kind")
    args = ap.parse_args()
    if args.batch < 2 or args.rounds < 1 or args.replay_rounds < 1:
        ap.error(f"--batch {args.batch}, --rounds {args.rounds}, --replay-rounds {args.replay_rounds}: a batch >= 2 "
                 "(one row takes the GEMV, which writes its logits) and rounds >= 1")
    if not torch.cuda.is_available():
        ap.error("logits_store_ab times a captured decode step on a CUDA GPU; none is visible")
    decode_bench.GEMM_CONFIG = args.gemm_config
    pipeline = decode_bench.build("llama3-8b", max_num_seqs=args.batch)
    model = pipeline.engines[0].model
    rows = torch.empty(args.batch, model.cfg.hidden_size, dtype=model.dtype, device="cuda")
    if not model.lm_head.folds(rows):
        sys.exit(f"at {args.batch} rows this table runs the head on cuBLAS, which writes its logits: "
                 "nothing to skip")
    print(f"{torch.cuda.get_device_name()}  {datetime.date.today().isoformat()}\n$ {' '.join(sys.argv)}")
    decode_ms(pipeline, args.batch, False)  # compile, capture
    times: dict[str, list[float]] = {k: [] for k in ("replay, write", "replay, skip", "decode, write", "decode, skip")}
    for r in range(max(args.rounds, args.replay_rounds)):
        order = (1, 0) if r % 2 == 0 else (0, 1)
        for wanted in order if r < args.replay_rounds else ():
            times[f"replay, {'write' if wanted else 'skip'}"].append(replay_ms(pipeline, args.batch, wanted))
        for write in (bool(w) for w in order) if r < args.rounds else ():
            times[f"decode, {'write' if write else 'skip'}"].append(decode_ms(pipeline, args.batch, write))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in times.items() if len(v) > r), flush=True)
    # The second timing of a round runs on a GPU the first has heated (~0.08 ms slower in call v3),
    # so each kind goes first in every other round and the summary is the mean over whole pairs of
    # rounds, in which each kind took each place equally often.
    print(f"\nbatch {args.batch}, ms a step: the mean over pairs of rounds (each kind first in every other one)")
    for k, v in times.items():
        even = v[:len(v) // 2 * 2] or v
        print(f"{k:<16} {statistics.fmean(even):.4f}   " + " ".join(f"{t:.4f}" for t in v))
    for what in ("replay", "decode"):
        w, s_ = (times[f"{what}, {kind}"] for kind in ("write", "skip"))
        n = len(w) // 2 * 2 or len(w)
        d = statistics.fmean(w[:n]) - statistics.fmean(s_[:n])
        firsts = [a - b for i, (a, b) in enumerate(zip(w, s_)) if i % 2 == 0]  # write first
        seconds = [a - b for i, (a, b) in enumerate(zip(w, s_)) if i % 2 == 1]  # skip first
        print(f"{what}: skipping the logits saves {d * 1e3:.1f} us a step "
              f"(write - skip, rounds with write first: {' '.join(f'{x * 1e3:+.0f}' for x in firsts)}; "
              f"with skip first: {' '.join(f'{x * 1e3:+.0f}' for x in seconds)} us)")


if __name__ == "__main__":
    main()
