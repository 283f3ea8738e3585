"""Program timelines of the decode kernels: a diagnostic, off unless SHARDLINE_TRACE_PROGRAMS=1.

With it on, every launch of the split-K GEMM (triton_quant.py), the ring GEMM (gluon_ring.py) and
decode attention (triton_attention.py) gets a buffer of [programs, len(FIELDS)] int64 words, and
each program writes into its row, from %globaltimer (ns): when it started, when its PDL wait
returned, when its first tiles had landed (the ring only: its consumers wait on a barrier; the
others' loads are pipelined out of sight, and they write 0 there), when it left its main loop
and when it exited, and the multiprocessor it ran on (%smid). The buffers are made at launch, in a graph capture from
the graph's pool, so a replayed graph rewrites them; `launches()` lists them in launch order
with a label saying which product or kernel each is. `benchmarks/program_trace.py` reads them.

Off, the kernels compile without the stores (TRACE is a constexpr) and nothing is allocated.
"""

from __future__ import annotations

import torch

from ._dispatch import TRACE_PROGRAMS

FIELDS = ("start", "waited", "first", "loop_end", "exit", "sm")
START, WAITED, FIRST, LOOP_END, EXIT, SM = range(len(FIELDS))
_launches: list[tuple[str, torch.Tensor]] = []
_weight_bytes: dict[str, int] = {}


def buffer(label: str, programs: int, like: torch.Tensor, weight_bytes: int = 0) -> tuple[torch.Tensor, bool]:
    """(the trace pointer, TRACE) for a launch of `programs` programs: a fresh buffer recorded
    under `label` when tracing is on, else `like` (unused) and False. `weight_bytes`: what the
    launch streams from memory, where it is a product (its label's, in `weight_bytes()`)."""
    if not TRACE_PROGRAMS:
        return like, False
    if weight_bytes:
        _weight_bytes[label] = weight_bytes
    # Empty, not zeroed: a fill kernel between two PDL launches would sit in their chain (each
    # kernel waits on the one before it in the stream), and every program writes every word.
    t = torch.empty((programs, len(FIELDS)), dtype=torch.int64, device=like.device)
    _launches.append((label, t))
    return t, True


def launches() -> list[tuple[str, torch.Tensor]]:
    return list(_launches)


def weight_bytes() -> dict[str, int]:
    """The bytes each traced product's label streams (its weights)."""
    return dict(_weight_bytes)


def clear() -> None:
    _launches.clear()
    _weight_bytes.clear()
