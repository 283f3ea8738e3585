"""The decode linears of a whole Llama-3-8B stack at batch 1, as one CUDA graph: how close the
weight stream gets to the copy bandwidth, unfused (cuBLAS + norm and activation kernels) against
the fused GEMV (kernels/gemv.py), with and without programmatic dependent launch.

    python benchmarks/gemv_bench.py [--layers 32] [--quant int8|fp8]

Per layer: RMSNorm -> qkv, o, RMSNorm -> gate/up -> SwiGLU -> down (attention left out: it
reads no weights). Each variant is captured once and replayed; the table gives ms per stack,
the weight bytes streamed per second, and the ratio to the unfused path.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from shardline.kernels import _dispatch, activation, gemv, norm, quant


def make_layers(n: int, quantization: str, device: str = "cuda") -> list[dict]:
    H, I, QKV = 4096, 14336, 6144
    layers = []
    for _ in range(n):
        layer = {}
        for name, shape in (("qkv", (QKV, H)), ("o", (H, H)), ("up", (2 * I, H)), ("down", (H, I))):
            w = torch.randn(shape, device=device, dtype=torch.bfloat16) * 0.02
            layer[name] = quant.WEIGHT_ONLY[quantization][1](w) if quantization in quant.WEIGHT_ONLY else (w, None)
        layer["n1"] = torch.ones(H, device=device, dtype=torch.bfloat16)
        layer["n2"] = torch.ones(H, device=device, dtype=torch.bfloat16)
        layers.append(layer)
    return layers


def unfused(layers: list[dict], h: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
    def linear(x, wq):
        w, s = wq
        return quant.quantized_linear(x, w, s) if s is not None else F.linear(x, w)

    for L in layers:
        x, res = norm.rms_norm(h, L["n1"], 1e-5, res)
        linear(x, L["qkv"])
        attn = linear(x[:, :4096].contiguous(), L["o"])  # stands in for the attention output
        x, res = norm.rms_norm(attn, L["n2"], 1e-5, res)
        h = linear(activation.silu_and_mul(linear(x, L["up"])), L["down"])
    return h


CONFIG: dict | None = None  # --config; None: the kernel's default tiles


def fused(layers: list[dict], h: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
    c = CONFIG
    for L in layers:
        qkv, res = gemv.fused_linear(h, *L["qkv"], None, L["n1"], res, 1e-5, config=c)
        attn, _ = gemv.fused_linear(qkv[:, :4096].contiguous(), *L["o"], config=c)
        act, res = gemv.fused_linear(attn, *L["up"], None, L["n2"], res, 1e-5, glu=True, config=c)
        h, _ = gemv.fused_linear(act, *L["down"], config=c)
    return h


def time_graph(fn, reps: int = 10) -> float:
    h = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(h)
    fn(h, res)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(h, res)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--quant", choices=["int8", "fp8"], help="weight-only quantization")
    ap.add_argument("--config", type=json.loads, help='GEMV tiles, e.g. \'{"BLOCK_N": 8, "BLOCK_K": 1024, "num_warps": 4}\'')
    args = ap.parse_args()
    global CONFIG
    CONFIG = args.config
    scheme = f"{args.quant}-weight-only" if args.quant else "none"
    layers = make_layers(args.layers, scheme)
    nbytes = sum(t.numel() * t.element_size() for L in layers for k in ("qkv", "o", "up", "down")
                 for t in L[k] if t is not None)
    rows = []
    for pdl in (False, True):
        _dispatch.PDL_DISABLED = not pdl
        for name, fn in (("unfused", lambda h, r: unfused(layers, h, r)), ("fused GEMV", lambda h, r: fused(layers, h, r))):
            ms = time_graph(fn)
            rows.append({"variant": name, "pdl": pdl, "quant": args.quant, "layers": args.layers, "ms": round(ms, 4),
                         "weight_GBps": round(nbytes / ms / 1e6, 1)})
            print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["ms"]
    print(f"\n{torch.cuda.get_device_name()}: {args.layers} layers of decode linears, batch 1, "
          f"{args.quant or 'bf16'} weights ({nbytes / 1e9:.2f} GB)")
    print(f"{'variant':<12} {'PDL':>4} {'ms':>8} {'GB/s':>8} {'vs unfused':>10}")
    for r in rows:
        print(f"{r['variant']:<12} {'on' if r['pdl'] else 'off':>4} {r['ms']:>8.3f} {r['weight_GBps']:>8.0f} "
              f"{base / r['ms']:>9.2f}x")


if __name__ == "__main__":
    main()
