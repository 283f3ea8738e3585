"""The decode linears of a Llama-3-8B stack at batch 16-64, as one CUDA graph: cuBLAS, the tuned
table's choices (cuBLAS or the tiled split-K Triton kernel, as `tune-gemm` picked them) and the
stream-K kernel (shardline/kernels/triton_streamk.py, SwiGLU fused), each against the copy bandwidth;
"tuned+triton" runs the split-K Triton kernel where the table chose cuBLAS, and "tuned, SwiGLU
kernel" the activation as a kernel of its own after the gate/up product.

    python -m benchmarks.skinny_bench [--batch 64] [--layers 32] [--sweep] [--per-linear]
        [--gemm-config benchmarks/results/gemm-h200-decode.json [--sweep-qkv-o] [--sweep-mlp] [--prefetch 0,1,4]
         [--ahead 4,6,8] [--tma]]

Per layer: RMSNorm -> qkv, o, RMSNorm -> gate/up -> SwiGLU -> down (attention left out: it reads
no weights). --per-linear also times each linear alone (a graph of --layers launches of it on
distinct weights, and the lm_head). --sweep times the stream-K kernel's candidate tiles in the
stack; --sweep-qkv-o the split-K kernel's (tune-gemm's list) for qkv and o, the rest as tuned;
--prefetch the table's choices with each depth of the split-K kernel's L2 prefetch before its
PDL wait, alone and with qkv and o on the split-K kernel as well; --ahead likewise with each
distance of its in-loop L2 prefetch (AHEAD); --sweep-mlp gate/up's and then down's split-K tiles
(tune-gemm's list and MLP_TILES), the rest as tuned; --tma the table's choices with the split-K
kernel's tiles loaded through tensor descriptors (and the two sweeps with them).
Every variant's output is checked against the cuBLAS stack's.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from benchmarks.arguments import depths
from benchmarks.gemv_bench import make_layers, time_graph
from shardline.gemm_tuning import GemmTable, agrees
from shardline.kernels import _dispatch, activation, norm, quant
from shardline.kernels._dispatch import sm_count
from shardline.kernels.triton_quant import default_config as default_small_m
from shardline.kernels.triton_streamk import default_config, streamk_linear_triton

H, I = 4096, 14336
SHAPES = {"qkv": (6144, H), "o": (H, H), "up": (2 * I, H), "down": (H, I)}


def stack(layers, h, res, linear, glu_linear):
    for L in layers:
        x, res = norm.rms_norm(h, L["n1"], 1e-5, res)
        qkv = linear("qkv", x, L["qkv"][0])
        attn = linear("o", qkv[:, :H], L["o"][0])  # q stands in for the attention output
        x, res = norm.rms_norm(attn, L["n2"], 1e-5, res)
        h = linear("down", glu_linear(x, L["up"][0]), L["down"][0])
    return h


def cublas(name, x, w):
    return F.linear(x, w)


def cublas_glu(x, w):
    return activation.silu_and_mul(F.linear(x, w))


def tuned(table: GemmTable, all_triton: bool = False, fuse_glu: bool = True, tiles: dict | None = None,
          extra: dict | None = None):
    """The table's choices, SwiGLU in the gate/up product's epilogue where it runs the split-K
    kernel or the ring GEMM (as the engine runs them; `fuse_glu=False`: the activation kernel after it); with
    `all_triton`, the split-K kernel (default tiles) where the table chose cuBLAS too: Triton's
    launches overlap through PDL, cuBLAS's do not. `tiles`: {linear name: split-K tiles} to run
    instead of the table's choice; `extra`: config keys set on every split-K launch (PREFETCH: the
    weight tiles asked of L2 before the PDL wait; TMA: loads through tensor descriptors; AHEAD:
    the in-loop L2 prefetch's distance)."""
    def config(c: dict) -> dict:
        return dict(c, **(extra or {}))

    def linear(name, x, w):
        if tiles and name in tiles:
            return quant.small_m_linear(x, w, None, None, config(tiles[name]))
        c = table.choice(*w.shape, w.dtype, x.dtype, x.shape[0])
        if c is not None and c["impl"] == "triton":
            return quant.small_m_linear(x, w, None, None, config(c["config"]))
        if c is not None and c["impl"] == "ring":
            return quant.ring_linear(x, w, None, c["config"])
        if all_triton:
            return quant.small_m_linear(x, w, None, None, default_small_m(x.shape[0], *w.shape, sm_count(x)))
        return F.linear(x, w)

    def glu_linear(x, w):
        if tiles and "up" in tiles:
            return quant.small_m_linear(x, w, None, None, config(tiles["up"]), glu=True)
        c = table.choice(*w.shape, w.dtype, x.dtype, x.shape[0])
        if fuse_glu and c is not None and c["impl"] == "triton":
            return quant.small_m_linear(x, w, None, None, config(c["config"]), glu=True)
        if fuse_glu and c is not None and c["impl"] == "ring":
            return quant.ring_linear(x, w, None, c["config"], glu=True)
        return activation.silu_and_mul(linear("up", x, w))
    return linear, glu_linear


def streamk(c: dict | None, c_glu: dict | None):
    return (lambda name, x, w: streamk_linear_triton(x, w, config=c),
            lambda x, w: streamk_linear_triton(x, w, glu=True, config=c_glu))


# Tiles beyond tune-gemm's list for the MLP's products: K tiles of 64 and fewer stages, so that
# two or three programs share a multiprocessor and gate/up's 224 tiles (one K split) run as one
# wave instead of 1.7.
MLP_TILES = [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=st) for bn, bk, sk, w, st in (
    (128, 64, 1, 4, 4), (128, 64, 1, 4, 3), (128, 64, 1, 8, 4), (128, 128, 1, 4, 3), (128, 128, 1, 8, 3),
    (256, 64, 1, 8, 3), (64, 128, 1, 4, 3), (64, 64, 1, 4, 4), (64, 64, 2, 4, 4), (32, 128, 2, 4, 4),
    (64, 128, 2, 4, 3), (128, 64, 2, 4, 4))]


def sweep_configs(M: int) -> list[tuple[dict, dict]]:
    """(tiles, gate/up tiles): K tile, stages in flight, programs a multiprocessor, prefetch."""
    out = []
    for bn, bk, stages, per_sm, prefetch, tma in (
            (128, 128, 4, 1, 0, 1), (128, 128, 3, 1, 0, 1), (128, 64, 6, 1, 0, 1), (64, 128, 4, 1, 0, 1),
            (256, 64, 4, 1, 0, 1), (128, 64, 3, 2, 0, 1), (128, 128, 4, 1, 0, 0), (128, 128, 4, 1, 2, 0),
            (128, 64, 6, 1, 0, 0)):
        c = dict(default_config(M, False), BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, PROGRAMS_PER_SM=per_sm,
                 PREFETCH=prefetch, TMA=tma)
        out.append((c, dict(c, BLOCK_N=c["BLOCK_N"] // 2)))
    return out


def per_linear(layers, M: int, table: GemmTable | None) -> None:
    lm_head = torch.randn(128256, H, device="cuda", dtype=torch.bfloat16) * 0.02
    print(f"\neach linear alone: {len(layers)} launches on distinct weights, batch {M}; us a launch and GB/s")
    print(f"{'linear':<7} {'cublas':>14} {'tuned':>14} {'stream-K':>14} {'stream-K TMA':>14}")
    for name, (n, k) in list(SHAPES.items()) + [("lm_head", (128256, H))]:
        ws = [lm_head] if name == "lm_head" else [L[name][0] for L in layers]
        x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
        glu = name == "up"
        nbytes = sum(w.numel() * 2 for w in ws)
        tma = dict(default_config(M, glu), TMA=1, PREFETCH=0)
        variants = {"cublas": lambda x, w: F.linear(x, w),
                    "stream-K": lambda x, w: streamk_linear_triton(x, w, glu=glu),
                    "stream-K TMA": lambda x, w: streamk_linear_triton(x, w, glu=glu, config=tma)}
        if table is not None:
            variants["tuned"] = lambda x, w, lin=tuned(table)[0]: lin(name, x, w)
        cols = {}
        for label, f in variants.items():
            ms, _ = time_graph(lambda h, r, f=f: [f(h, w) for w in ws][-1], x, None, reps=20)
            us = ms * 1e3 / len(ws)
            cols[label] = f"{us:7.2f} {nbytes / ms / 1e6:6.0f}"
            print(json.dumps({"linear": name, "variant": label, "batch": M, "us": round(us, 2),
                              "weight_GBps": round(nbytes / ms / 1e6, 1)}), flush=True)
        print(f"{name:<7} {cols['cublas']:>14} {cols.get('tuned', '-'):>14} {cols['stream-K']:>14} "
              f"{cols['stream-K TMA']:>14}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--gemm-config", help="a `shardline tune-gemm` table: its choices are the 'tuned' row")
    ap.add_argument("--sweep", action="store_true", help="time the stream-K kernel's candidate tiles")
    ap.add_argument("--per-linear", action="store_true", help="also time each linear alone")
    ap.add_argument("--prefetch", type=depths, default=[],
                    help="with --gemm-config: the table's choices with each of these PREFETCH depths (e.g. 0,1,2,4,8)")
    ap.add_argument("--ahead", type=depths, default=[],
                    help="with --gemm-config: the table's choices with each of these AHEAD distances (e.g. 4,6,8)")
    ap.add_argument("--sweep-mlp", action="store_true",
                    help="with --gemm-config: the table's choices, gate/up and then down on each split-K tile "
                         "(tune-gemm's list and MLP_TILES)")
    ap.add_argument("--sweep-qkv-o", action="store_true",
                    help="with --gemm-config: the table's choices, qkv and o on each split-K candidate tile")
    ap.add_argument("--tma", action="store_true",
                    help="with --gemm-config: the table's choices with TMA loads in the split-K kernel, and "
                         "--sweep-mlp / --sweep-qkv-o with them too")
    args = ap.parse_args()
    if not args.gemm_config and (args.prefetch or args.ahead or args.sweep_mlp or args.sweep_qkv_o or args.tma):
        ap.error("--prefetch, --ahead, --sweep-mlp, --sweep-qkv-o and --tma vary the tuned table's choices: "
                 "pass the table with --gemm-config")
    layers = make_layers(args.layers, "none")
    table = GemmTable.load(args.gemm_config, torch.device("cuda")) if args.gemm_config else None
    if args.gemm_config and table is None:
        ap.error(f"--gemm-config {args.gemm_config}: missing, or tuned on another GPU than "
                 f"{torch.cuda.get_device_name()} (run `shardline tune-gemm`)")
    nbytes = sum(L[k][0].numel() * 2 for L in layers for k in SHAPES)
    h = torch.randn(args.batch, H, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(h)
    rows, reference = [], None

    def run(name, linears, tiles=None):
        nonlocal reference
        try:
            ms, out = time_graph(lambda h, r: stack(layers, h, r, *linears), h, res)
        except Exception as e:  # a candidate that does not compile or launch is reported, not fatal
            print(f"{name} {tiles}: failed: {type(e).__name__}: {e}", flush=True)
            return
        reference = out if reference is None else reference
        rows.append({"variant": name, "batch": args.batch, "layers": args.layers, "ms": round(ms, 4),
                     "weight_GBps": round(nbytes / ms / 1e6, 1), "tiles": tiles, "agrees": agrees(out, reference, 0.1)})
        print(json.dumps(rows[-1]), flush=True)

    _dispatch.PDL_DISABLED = False
    run("cublas", (cublas, cublas_glu))
    if table is not None:
        run("tuned table", tuned(table))
        run("tuned, SwiGLU kernel", tuned(table, fuse_glu=False))
        run("tuned+triton", tuned(table, all_triton=True))
    run("stream-K", streamk(None, None))
    fixed = len(rows)
    if args.sweep:
        for c, c_glu in sweep_configs(args.batch):
            run("stream-K", streamk(c, c_glu), [c, c_glu])
    # qkv and o on split-K too: the tile --sweep-qkv-o found best on the H200 (2026-11-30)
    qkv_o = dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4)
    for label, key_, values in (("prefetch", "PREFETCH", args.prefetch), ("ahead", "AHEAD", args.ahead)):
        for depth in values:
            run(f"tuned, {label}", tuned(table, extra={key_: depth}), [{key_: depth}])
            run("tuned, qkv/o split-K", tuned(table, tiles={"qkv": qkv_o, "o": qkv_o}, extra={key_: depth}),
                [dict(qkv_o, **{key_: depth})])
    tma = {"TMA": 1} if args.tma else {}
    if args.tma:
        run("tuned, TMA", tuned(table, extra=tma), [tma])
        run("tuned, TMA, qkv/o split-K", tuned(table, tiles={"qkv": qkv_o, "o": qkv_o}, extra=tma), [dict(qkv_o, **tma)])
    if args.sweep_mlp:
        from shardline.gemm_tuning import triton_candidates
        for name in ("up", "down"):
            for c in triton_candidates(args.batch) + MLP_TILES:
                run(f"tuned, {name} split-K", tuned(table, tiles={name: c}, extra=tma), [dict(c, **tma)])
    if args.sweep_qkv_o:  # in the stack, where PDL overlaps them with their neighbours
        from shardline.gemm_tuning import triton_candidates
        for c in triton_candidates(args.batch):
            run("tuned, qkv/o split-K", tuned(table, tiles={"qkv": c, "o": c}, extra=tma), [dict(c, **tma)])
    print(f"\n{torch.cuda.get_device_name()}: {args.layers} layers of decode linears, batch {args.batch}, "
          f"bf16 weights ({nbytes / 1e9:.2f} GB); norms and SwiGLU included")
    print(f"{'variant':<21} {'ms':>8} {'GB/s':>8} {'vs cublas':>9}  tiles (WRONG: output differs from cuBLAS)")
    base = rows[0]["ms"]
    for r in rows[:fixed] + sorted(rows[fixed:], key=lambda r: r["ms"]):
        tiles = "" if r["tiles"] is None else ",".join(f"{k}={v}" for k, v in r["tiles"][0].items())
        print(f"{r['variant']:<21} {r['ms']:>8.3f} {r['weight_GBps']:>8.0f} {base / r['ms']:>8.2f}x  {tiles}"
              f"{'' if r['agrees'] else '  WRONG'}")
    if args.per_linear:
        per_linear(layers, args.batch, table)


if __name__ == "__main__":
    main()
