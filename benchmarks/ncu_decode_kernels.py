"""The batch-64 decode step's kernels, each launched once, eagerly, inside an NVTX range
`prof_<name>`, for Nsight Compute's hardware counters (which a CUDA graph's PDL overlap would not
show per kernel):

    ncu --clock-control none --nvtx --nvtx-include prof_gate_up/ --nvtx-include prof_down/ \\
        --nvtx-include prof_qkv/ --nvtx-include prof_o/ --nvtx-include prof_attention/ --set full \\
        -o k64 python -m benchmarks.ncu_decode_kernels benchmarks/results/gemm-h200-decode.json
    ncu -i k64.ncu-rep --page details

Llama-3-8B shapes, random weights, the table's batch-64 tiles; attention is the rotary-fused
decode kernel at context 192 (the step's replay context), 16-token blocks scattered in the cache.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.kernels_bench import BF16, HD, decode_step_inputs
from shardline.kernels import attention, quant


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gemm_config", help="a tune-gemm table with batch-64 entries for the four products")
    ap.add_argument("--context", type=int, default=192)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("this launches CUDA kernels for a profiler; no GPU is visible")
    table = json.load(open(args.gemm_config))["entries"]

    def cfg(n: int, k: int) -> dict:
        return table[f"{n}x{k}:bfloat16:bfloat16"]["64"]["config"]

    B, ctx = 64, args.context
    x = torch.randn(B, 4096, device="cuda", dtype=BF16)
    act = torch.randn(B, 14336, device="cuda", dtype=BF16)
    w = {name: torch.randn(n, k, device="cuda", dtype=BF16) * 0.02
         for name, (n, k) in dict(gate_up=(2 * 14336, 4096), down=(4096, 14336), qkv=(6144, 4096), o=(4096, 4096)).items()}
    q, k, v, pos, cos_sin, kc, vc, slots, tables, seq_lens, qsl, scale = decode_step_inputs(B, ctx)
    runs = {
        "gate_up": lambda: quant.small_m_linear(x, w["gate_up"], None, None, cfg(28672, 4096), glu=True),
        "down": lambda: quant.small_m_linear(act, w["down"], None, None, cfg(4096, 14336)),
        "qkv": lambda: quant.ring_linear(x, w["qkv"], None, cfg(6144, 4096)),
        "o": lambda: quant.ring_linear(x, w["o"], None, cfg(4096, 4096)),
        "attention": lambda: attention.rotary_decode_attention(q, k, v, pos, cos_sin, HD, kc, vc, slots, tables,
                                                               seq_lens, qsl, scale, max_seq_len=ctx),
    }
    for fn in runs.values():  # compiled and warm before the profiled launches
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    for name, fn in runs.items():
        torch.cuda.nvtx.range_push(f"prof_{name}")
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    print(f"launched {', '.join(runs)} once each inside prof_<name> ranges")


if __name__ == "__main__":
    main()
