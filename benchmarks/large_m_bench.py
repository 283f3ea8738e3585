"""Llama's decode products at large batches (256 rows), each in the form the engine runs it:
cuBLAS with the kernels the unfused layer runs around it (the RMSNorm before qkv and gate/up,
SwiGLU after gate/up; for the head the final norm, fp32 logits and the argmax), against the
split-K Triton kernel's large-M tiles with the fold in their epilogue (the norm's 1 / rms, the
residual add and its sums of squares, SwiGLU, fp32 logits and the tile argmax), as a decode step of
folded layers runs them. A layer folds only when all four products do, so the sums say whether a
table of Triton entries at this batch can pay.

    python -m benchmarks.large_m_bench [--batch 256] [--configs '[{...}, ...]']

Each form runs as CUDA-graph replays cycling through >= 256 MB of weight copies (out of L2, as in a
step); the Triton forms' outputs are checked against the cuBLAS forms'. Prints µs and TFLOP/s.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from shardline.config import ModelConfig
from shardline.gemm_tuning import _time_graph_us, agrees, linear_shapes
from shardline.kernels import activation, argmax, norm, quant
from shardline.model.random_weights import SHAPES


# The split-K kernel's tiles of 128 or 256 rows (a weight tile read by one or two programs, not
# by batch / 64): (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps, stages), TMA loads. On the H200 at
# 256 rows every one lost to cuBLAS with its kernels, the best tile by 4-50% a product (2026-11-30
# o, docs/benchmarks.md), so tune-gemm does not time them above 64 rows.
LARGE_M_TILES = [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=st, TMA=1)
                 for bm, bn, bk, sk, w, st in (
                     (128, 128, 64, 1, 8, 4), (128, 256, 64, 1, 8, 3), (256, 128, 64, 1, 8, 3),
                     (256, 64, 64, 1, 8, 4), (256, 128, 64, 2, 8, 3), (128, 128, 64, 2, 8, 4),
                     (128, 128, 128, 1, 8, 3))]


def forms(name: str, x: torch.Tensor, res: torch.Tensor, norm_w: torch.Tensor, eps: float):
    """(the unfused form (i, ws) -> output, the folded form (i, ws, cfg) -> output) of one product."""
    rows = x.shape[0]
    ss = norm.sum_squares_ref(x)  # the stream's sums of squares, as the product before leaves them
    row_norm = norm.RowNorm(ss.contiguous(), eps)
    ids = torch.empty(rows, dtype=torch.int64, device=x.device)
    if name in ("qkv_proj", "up_proj"):
        glu = name == "up_proj"

        def unfused(i, ws):
            y = F.linear(norm.rms_norm(x, norm_w, eps)[0], ws[i])
            return activation.silu_and_mul(y) if glu else y

        def folded(i, ws, cfg):
            return quant.small_m_linear(x, ws[i], None, None, cfg, glu=glu, norm=row_norm)
    elif name in ("o_proj", "down_proj"):
        def unfused(i, ws):  # the residual add runs in the next norm's kernel, counted there
            return F.linear(x, ws[i])

        def folded(i, ws, cfg):  # the stream's next value; `product` takes the residual back off to check it
            return quant.small_m_linear(x, ws[i], None, None, cfg, residual=res)[0]
    else:  # lm_head: the final norm, fp32 logits, each row's argmax
        def unfused(i, ws):
            logits = F.linear(norm.rms_norm(x, norm_w, eps)[0], ws[i]).float()
            argmax.argmax_rows(logits, out=ids)
            return logits

        def folded(i, ws, cfg):
            return quant.small_m_linear(x, ws[i], None, None, cfg, out_dtype=torch.float32, norm=row_norm,
                                        greedy=quant.GreedyIds(ids, ws[i].shape[0]))
    def product(out):
        return out - res if name in ("o_proj", "down_proj") else out
    return unfused, folded, product


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--configs", help="JSON list of split-K configs (default: LARGE_M_TILES)")
    ap.add_argument("--only", help="comma-separated products (qkv_proj,o_proj,up_proj,down_proj,lm_head)")
    args = ap.parse_args()
    cfg = ModelConfig(**SHAPES["llama3-8b"])
    names = list(linear_shapes(cfg))
    if args.batch < 1:
        ap.error(f"--batch {args.batch}: rows >= 1, e.g. 256")
    only = set(args.only.split(",")) if args.only else None
    if only and only - set(names):
        ap.error(f"--only {args.only}: unknown {sorted(only - set(names))}; a comma list of {','.join(names)}")
    try:
        configs = json.loads(args.configs) if args.configs else LARGE_M_TILES
    except json.JSONDecodeError as e:
        ap.error(f"--configs takes a JSON list of split-K configs ({e}), e.g. "
                 f"'[{json.dumps(LARGE_M_TILES[0])}]'")
    if not (isinstance(configs, list) and all(isinstance(c, dict) for c in configs)):
        ap.error(f"--configs takes a JSON list of objects, e.g. '[{json.dumps(LARGE_M_TILES[0])}]'; got {args.configs!r}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    dev, dt, m = torch.device("cuda"), torch.bfloat16, args.batch
    print(f"batch {m}, {torch.cuda.get_device_name(dev)}; us a product (TFLOP/s)")
    best_sum, unfused_sum = 0.0, 0.0
    for name, (n, k) in linear_shapes(cfg).items():
        if only and name not in only:
            continue
        w = torch.randn(n, k, device=dev, dtype=dt) * 0.02
        copies = max(1, -(-(256 << 20) // (w.numel() * w.element_size())))
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        x = torch.randn(m, k, device=dev, dtype=dt)
        res = torch.randn(m, n, device=dev, dtype=dt)
        norm_w = torch.ones(k, device=dev, dtype=dt)  # a folded norm weight is in w already
        unfused, folded, product = forms(name, x, res, norm_w, cfg.norm_eps)
        flops = 2 * m * n * k
        reference = unfused(0, ws)
        base = _time_graph_us(lambda i: unfused(i, ws), copies)
        rows = [("cublas, unfused", base)]
        if name == "lm_head":  # cuBLAS writing the fp32 logits itself (no conversion kernel after it)
            def fp32_out(i):
                logits = torch.mm(norm.rms_norm(x, norm_w, cfg.norm_eps)[0], ws[i].t(), out_dtype=torch.float32)
                argmax.argmax_rows(logits, out=torch.empty(m, dtype=torch.int64, device=dev))
                return logits
            rows.append(("cublas, fp32 logits (mm out_dtype), unfused", _time_graph_us(fp32_out, copies)))
        for c in configs:
            try:
                if not agrees(product(folded(0, ws, c)), reference):
                    rows.append((json.dumps(c), float("nan")))
                    continue
                rows.append((json.dumps(c), _time_graph_us(lambda i, c=c: folded(i, ws, c), copies)))
            except Exception as e:  # noqa: BLE001 - a tile that does not compile is reported, not fatal
                rows.append((f"{json.dumps(c)} failed: {str(e).splitlines()[0][:80]}", float("nan")))
        folded_rows = rows[2:] if name == "lm_head" else rows[1:]  # the split-K tiles only
        best = min((us for _, us in folded_rows if us == us), default=float("nan"))
        unfused_sum += base
        best_sum += best if best == best else float("inf")
        print(f"\n{name} [{n}, {k}]")
        for label, us in rows:
            print(f"  {us:8.2f} us {flops / us / 1e6 if us == us else 0:7.1f}  {label}")
    print(f"\nsum: cublas unfused {unfused_sum:.1f} us, the best split-K tile folded {best_sum:.1f} us "
          f"({unfused_sum / best_sum:.3f}x: above 1, a table of split-K entries at this batch could pay)")


if __name__ == "__main__":
    main()
