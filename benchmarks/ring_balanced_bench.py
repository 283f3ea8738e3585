"""Llama-3-8B's gate/up, qkv, o and down at 64 rows, each alone: cuBLAS, the H200 table's split-K
tile (gate/up, down), the tiled ring GEMM and the ring's balanced form (shardline/kernels/gluon_ring.py).

    python -m benchmarks.ring_balanced_bench

Each product runs as CUDA-graph replays cycling through weight copies (gemm_tuning._time_graph_us,
what `shardline tune-gemm` times), so the weights stream from memory, not L2. A tile that cannot
fit a shape prints the ring's ValueError; an output that disagrees with the reference prints
WRONG. Alone is not the step: docs/benchmarks.md has both for these tiles.
"""

from __future__ import annotations

import torch

from shardline.gemm_tuning import _time_graph_us, agrees
from shardline.kernels import quant

PRODUCTS = [  # name, N (with SwiGLU: gate + up rows), K, SwiGLU, the H200 table's split-K tile or None
    ("gate/up", 28672, 4096, True, dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4, TMA=1)),
    ("qkv", 6144, 4096, False, None),
    ("o", 4096, 4096, False, None),
    ("down", 4096, 14336, False, dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=5, TMA=1)),
]
BALANCED = [{"SUB": 16, "BLOCK_K": 64, "STAGES": 5}, {"SUB": 16, "BLOCK_K": 64, "STAGES": 4},
            {"SUB": 16, "BLOCK_K": 128, "STAGES": 6}, {"SUB": 16, "BLOCK_K": 128, "STAGES": 4},
            {"SUB": 32, "BLOCK_K": 64, "STAGES": 5}, {"SUB": 8, "BLOCK_K": 128, "STAGES": 6}]


def main() -> None:
    for name, n, k, glu, split_k in PRODUCTS:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        copies = max(1, -(-(256 << 20) // (w.numel() * 2)))
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        x = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
        ref = quant.linear_ref(x, w, None, None, glu=glu)
        cands = {"cublas": (lambda i: torch.nn.functional.linear(x, ws[i]), None)}  # the product only, no SwiGLU
        if split_k:
            cands["split-K table"] = (lambda i: quant.small_m_linear(x, ws[i], None, None, split_k, glu=glu), ref)
        tiled = dict(BLOCK_N=128, BLOCK_K=128, STAGES=3) if glu else dict(BLOCK_N=64, BLOCK_K=128, STAGES=4)
        for cfg in [tiled] + BALANCED:
            label = "ring " + ",".join(f"{a}={b}" for a, b in cfg.items())
            cands[label] = (lambda i, c=cfg: quant.ring_linear(x, ws[i], None, c, glu=glu), ref)
        for label, (fn, want) in cands.items():
            try:
                ok = want is None or agrees(fn(0), want)
                us = _time_graph_us(fn, copies)
            except ValueError as e:
                print(f"{name:8} {label:40} cannot run: {str(e)[:100]}", flush=True)
                continue
            print(f"{name:8} {label:40} {us:8.2f} us {n * k * 2 / 1e6 / us:6.2f} TB/s {'ok' if ok else 'WRONG'}",
                  flush=True)


if __name__ == "__main__":
    main()
