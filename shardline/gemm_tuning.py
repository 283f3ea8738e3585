"""GEMM autotuning: time each candidate for the model's real linear shapes and batch sizes on this
GPU, keep the fastest, and let the stage worker load the choice.

    shardline tune-gemm --shape llama3-8b --batches 1,16,32,64,256 --out gemm-h200.json
    python -m shardline.stage_worker ... --gemm-config gemm-h200.json

Candidates per (N, K, weight dtype, batch rows M): the default (cuBLAS's F.linear; for int8/fp8
weights, the split-K kernel's default tiles), the split-K small-M Triton kernel
(shardline/kernels/triton_quant.py; its best tile also with an L2 prefetch AHEAD of
its loads, `ahead_candidates`), on Hopper the ring GEMM (shardline/kernels/gluon_ring.py) and,
for M = 1, the decode GEMV (shardline/kernels/triton_gemv.py and
cuda_gemv.py) in the fused form the engine runs it (RMSNorm before qkv, the head and gate/up;
SwiGLU after gate/up), each at a few tile configurations. A candidate's output must first agree
with the reference (`agrees`); then it is timed as CUDA-graph replays, as the engine runs decode.
The file is keyed by
GPU name; on another GPU, or when the file is missing, the engine warns and keeps its defaults.
A call with M rows uses the entry of the smallest tuned M >= M (decode graphs run at exactly the
bucket sizes); above the largest, the default path, and one row takes the default GEMV unless
batch 1 itself was tuned.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shardline.config import ConfigError, ModelConfig
from shardline.graph_capture import collected_garbage
from shardline.kernels.gemv import GEMV_MAX_M

log = logging.getLogger("shardline.gemm_tuning")
TRITON_CONFIGS = [dict(BLOCK_N=bn, BLOCK_K=128, SPLIT_K=sk, num_warps=4, num_stages=4)
                  for bn in (32, 64, 128) for sk in (1, 2, 4, 8)]
# Above M = 16 (64-row tiles on the tensor cores), also deeper or wider K tiles and 8 warps: at
# M = 64 cuBLAS streams the 4096-row projections at only ~3 TB/s (tune-gemm-h200.log).
TRITON_CONFIGS_WIDE = [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=st)
                       for bn, bk, sk, w, st in (
                           (32, 256, 2, 4, 3), (32, 256, 4, 4, 3), (64, 256, 2, 4, 3), (64, 256, 4, 4, 3),
                           (128, 128, 2, 8, 4), (128, 128, 4, 8, 4), (128, 64, 2, 4, 5), (128, 64, 4, 4, 5),
                           (64, 64, 4, 4, 6), (64, 64, 8, 4, 6), (64, 128, 2, 4, 5), (32, 128, 4, 4, 5),
                           (128, 256, 1, 8, 2), (128, 256, 2, 8, 2))]


def streamk_candidates(m: int) -> list[dict]:
    """The stream-K kernel's tiles (shardline/kernels/triton_streamk.py): its default, with TMA loads, and
    with the PDL prefetch off."""
    from shardline.kernels.triton_streamk import default_config
    base = default_config(m, False)
    return [base, dict(base, TMA=1, PREFETCH=0), dict(base, PREFETCH=0)]


def triton_candidates(m: int, tma: bool = False) -> list[dict]:
    """The split-K Triton tiles timed at M = m: none above SMALL_M_MAX (64), where the product is
    compute-bound and cuBLAS is the choice. `tma` (Hopper and later): each tile also with its
    loads through tensor descriptors (at batch 64 on the H200 the table's tiles with TMA ran the
    32-layer stack 3.94 ms against 4.01, docs/benchmarks.md)."""
    from shardline.kernels.triton_quant import SMALL_M_MAX  # Triton only where tuning runs
    if m > SMALL_M_MAX:
        return []
    tiles = TRITON_CONFIGS + (TRITON_CONFIGS_WIDE if m > 16 else [])
    return tiles + ([dict(c, TMA=1) for c in tiles] if tma else [])


# The ring GEMM's tiles (shardline/kernels/gluon_ring.py, Hopper): weight rows and K columns a stage, stages
# in the ring, K splits; the default also with EARLY=0 (no weights requested before the PDL wait:
# what that costs or gains, measured where it counts).
RING_CONFIGS = [dict(BLOCK_N=bn, BLOCK_K=bk, STAGES=st, SPLIT_K=sk) for bn, bk, st, sk in (
    (128, 128, 3, 1), (128, 128, 4, 1), (128, 128, 3, 2), (64, 128, 4, 1), (64, 128, 4, 2), (64, 128, 6, 2),
    (128, 64, 6, 1), (256, 64, 3, 1), (32, 128, 6, 4), (64, 128, 4, 4))]
RING_CONFIGS += [dict(RING_CONFIGS[0], EARLY=0)]
# ... and its balanced form (SUB rows a run, runs dealt evenly to WAVES programs a multiprocessor):
# every program streams the same bytes, where the tiles leave a partial last wave. A tile that
# cannot fit a shape (shared memory, wgmma's 256 rows) is a ValueError, and no candidate there.
RING_CONFIGS += [dict(SUB=sub, BLOCK_K=bk, STAGES=st, WAVES=wv) for sub, bk, st, wv in (
    (16, 64, 5, 1), (16, 64, 4, 1), (16, 128, 6, 1), (16, 128, 5, 1), (16, 128, 4, 1), (32, 64, 5, 1), (8, 128, 6, 1),
    (16, 64, 3, 2), (16, 64, 3, 4))]
# The ring's MAXNREG key (registers capped, so another program fits beside it) is no candidate:
# capped twins of these tiles and half-size capped tiles gained nothing in the H200's step, and
# the half-size ones lost 0.1-0.8 ms (docs/benchmarks-history.md, 2026-11-30 i).


def ring_candidates(m: int, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None) -> list[dict]:
    """RING_CONFIGS where the ring GEMM takes the operands (Hopper with Gluon, x-dtype weights,
    at most 64 rows), else none."""
    from shardline.kernels import quant
    if scale is not None or not quant.ring_available(x) or quant.ring_fits(x, w) is not None:
        return []
    return list(RING_CONFIGS)


def gemv_candidates(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None) -> list[dict]:
    """GEMV_CONFIGS the GEMV kernels take for these operands: the Triton tiles always, the CUDA C
    ones where that kernel fits (its bulk-copy form on Hopper only)."""
    from shardline.kernels import cuda_gemv
    from shardline.kernels._dispatch import hopper_or_later
    return [c for c in GEMV_CONFIGS if c["backend"] == "triton"
            or (cuda_gemv.fits(x, w, scale, None) and (not c.get("BULK") or hopper_or_later(x)))]


def ahead_candidates(cfg: dict) -> list[dict]:
    """Twins of a split-K tile whose loop also asks L2 for the weight tile AHEAD tiles on (the ring
    in shared memory holds num_stages - 1 in flight; these reach 1, 3 and 5 tiles past it). Timed
    for the best split-K tile of each shape, not for every tile: the depth is a property of the
    stream, not of the tile."""
    stages = cfg.get("num_stages", 4)
    return [dict(cfg, AHEAD=stages + d) for d in (0, 2, 4)]


# GEMV tiles (batch 1). Triton: 16 or 32 weight elements per thread per tile, the ones that
# compile without spills for every fused variant (benchmarks/gemv_registers.py). CUDA C: warps per
# block, rows per warp, 16-byte chunks in flight per row and lane, blocks per multiprocessor.
GEMV_CONFIGS = [dict(backend="triton", BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=1) for bn, bk, w in (
    (4, 512, 4), (4, 1024, 4), (8, 512, 4), (4, 1024, 8), (8, 512, 8), (8, 1024, 8), (16, 512, 8))]
GEMV_CONFIGS += [dict(backend="cuda", WARPS=w, ROWS=r, UNROLL=u, BLOCKS=b) for w, r, u, b in (
    (8, 2, 4, 2), (8, 2, 4, 1), (8, 2, 4, 3), (8, 2, 4, 0), (8, 1, 8, 2), (8, 1, 4, 2), (4, 2, 4, 4),
    (16, 2, 4, 1), (8, 4, 2, 2))]
GEMV_CONFIGS += [dict(backend="cuda", WARPS=w, ROWS=r, UNROLL=u, BLOCKS=0, PIPE=1) for w, r, u in (
    (8, 2, 4), (8, 1, 8), (8, 2, 6), (4, 2, 4))]
# The tensor-core form (MMA=1): warps per block (splitting K), steps in flight per lane, and the
# same PIPE choice.
GEMV_CONFIGS += [dict(backend="cuda", MMA=1, WARPS=w, UNROLL=u, PIPE=p) for w, u, p in (
    (4, 4, 0), (8, 4, 0), (8, 2, 0), (16, 2, 0), (4, 8, 0), (8, 4, 1), (4, 4, 1))]
# The bulk-copy form (BULK=1): consumer warps, blocks per multiprocessor, stage and ring sizes in
# KB (rows a stage and stages follow from them per K), and its tensor-core consumers (MMA=1).
GEMV_CONFIGS += [dict(backend="cuda", BULK=1, WARPS=w, BLOCKS=b, STAGE_KB=st, RING_KB=rg) for w, b, st, rg in (
    (8, 2, 32, 96), (8, 2, 16, 96), (8, 2, 24, 96), (8, 2, 32, 64), (16, 2, 32, 96), (4, 2, 32, 96),
    (8, 3, 24, 72), (8, 2, 16, 48), (8, 2, 24, 48), (8, 2, 16, 32), (8, 1, 32, 96), (16, 1, 32, 96))]
# ... and PRE, the stages streamed before the wait for the kernel before (the rest once x is in;
# 0: the whole ring); the entries above take the default, 2.
GEMV_CONFIGS += [dict(backend="cuda", BULK=1, WARPS=8, BLOCKS=2, STAGE_KB=st, RING_KB=rg, PRE=pre) for st, rg, pre in (
    (32, 96, 1), (32, 96, 0), (16, 96, 1), (16, 96, 0), (24, 96, 1), (32, 64, 1))]
GEMV_CONFIGS += [dict(backend="cuda", BULK=1, MMA=1, WARPS=w, BLOCKS=b, STAGE_KB=st, RING_KB=rg)
                 for w, b, st, rg in ((8, 2, 32, 96), (8, 2, 16, 96), (4, 2, 32, 96))]
# How the engine runs each linear through the GEMV: (RMSNorm fused before, SwiGLU fused after).
GEMV_FUSION = {"qkv_proj": (True, False), "o_proj": (False, False), "up_proj": (True, True),
               "down_proj": (False, False), "lm_head": (True, False)}


TABLE_IMPLS = ("cublas", "triton", "ring", "streamk", "gemv", "exp12")
# triton_streamk.streamk_linear_triton's config: its tile, programs and launch options.
STREAMK_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "PROGRAMS_PER_SM", "PROGRAMS", "PREFETCH",
                "TMA")


def key(n: int, k: int, w_dtype: torch.dtype, x_dtype: torch.dtype) -> str:
    return f"{n}x{k}:{str(w_dtype).removeprefix('torch.')}:{str(x_dtype).removeprefix('torch.')}"


@dataclass
class GemmTable:
    gpu: str
    # key -> {M: {"impl": "cublas" | "triton" | "ring" | "streamk" | "gemv", "config": {...}, "us": float, "cublas_us": float}}
    entries: dict[str, dict[int, dict]] = field(default_factory=dict)

    def choice(self, n: int, k: int, w_dtype: torch.dtype, x_dtype: torch.dtype, m: int) -> dict | None:
        by_m = self.entries.get(key(n, k, w_dtype, x_dtype))
        if not by_m:
            return None
        ms = sorted(by_m)
        i = bisect.bisect_left(ms, m)
        if i == len(ms) or (m <= GEMV_MAX_M < ms[i]):
            return None  # above the largest; or a batch-1 row the table was not tuned for: the GEMV's
        return by_m[ms[i]]

    def save(self, path: str | Path) -> None:
        data = {"gpu": self.gpu, "entries": {k: {str(m): v for m, v in d.items()} for k, d in self.entries.items()}}
        Path(path).write_text(json.dumps(data, indent=1) + "\n")

    def problems(self) -> list[str]:
        """What a kernel could not take, one line an entry: an unknown implementation, or a split-K
        or ring config its kernel refuses (quant.split_k_config, quant.ring_config), or keys the
        stream-K kernel does not know. The GEMV checks its tiles where it runs (cuda_gemv)."""
        from shardline.kernels.exp12 import exp12_config
        from shardline.kernels.quant import ring_config, split_k_config
        out = []
        for k, by_m in self.entries.items():
            for m, entry in sorted(by_m.items()):
                where = f"entry {k} at {m} rows"
                impl = entry.get("impl") if isinstance(entry, dict) else None
                config = entry.get("config") if isinstance(entry, dict) else None
                if impl not in TABLE_IMPLS:
                    out.append(f"{where}: impl {impl!r} unknown; one of {', '.join(TABLE_IMPLS)}")
                elif config is not None and not isinstance(config, dict):
                    out.append(f"{where}: config {config!r} is not an object of keys")
                elif impl == "streamk" and set(config or {}) - set(STREAMK_KEYS):
                    out.append(f"{where}: stream-K config keys {sorted(set(config) - set(STREAMK_KEYS))} unknown; "
                               f"it takes {', '.join(STREAMK_KEYS)}")
                else:
                    try:
                        if impl == "triton" and config:
                            split_k_config(config)
                        elif impl == "ring":
                            ring_config(config)
                        elif impl == "exp12":
                            exp12_config(config)
                    except ValueError as e:
                        out.append(f"{where}: {e}")
        return out

    @classmethod
    def load(cls, path: str | Path, device: torch.device) -> "GemmTable | None":
        """The table, or None (with a warning) when it is missing or was tuned on another GPU; a
        ConfigError (`checked`) when it is no table or a kernel could not take an entry: at
        startup, not at the first step that runs it."""
        p = Path(path)
        if not p.is_file():
            log.warning("GEMM config %s not found; using default GEMM choices (run `shardline tune-gemm`)", p)
            return None
        table = cls.checked(p)
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        if table.gpu != gpu:
            log.warning("GEMM config %s was tuned on %r, this is %r; using default GEMM choices", p, table.gpu, gpu)
            return None
        return table

    @classmethod
    def checked(cls, path: str | Path) -> "GemmTable":
        """The table in the file, or a ConfigError naming the file, the first entry no kernel takes
        (`problems`) and the fix, or saying that the file is no table."""
        try:
            table = cls.read(path)
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
            raise ConfigError(f"GEMM config {path} is not a `shardline tune-gemm` table ({type(e).__name__}: {e}); "
                              "re-run `shardline tune-gemm --out` or leave the GEMM config out") from None
        problems = table.problems()
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ConfigError(f"GEMM config {path}: {problems[0]}{more}; fix the entry or re-run `shardline tune-gemm`")
        return table

    @classmethod
    def read(cls, path: str | Path) -> "GemmTable":
        """The table in the file, whichever GPU it was tuned on (`load` is the engine's, which checks)."""
        data = json.loads(Path(path).read_text())
        return cls(data.get("gpu"), {k: {int(m): v for m, v in d.items()} for k, d in data["entries"].items()})


def bucket_gaps(table: GemmTable, keys: dict[str, str]) -> dict[str, list[int]]:
    """Per projection (name -> its table key, `key(...)`), the batch buckets above one row that
    another projection has an entry for and it lacks. Rows of such a bucket run it on a larger
    bucket's entry, one chosen beside other neighbours (16 rows on batch 32's gate/up and down
    entries ran 5.0 ms a step on the H200 against 4.5 with their own). Leave the head out: its rows
    fill the GPU at any batch."""
    have = {name: {m for m in table.entries.get(k, {}) if m > 1} for name, k in keys.items()}
    every = set().union(*have.values()) if have else set()
    return {name: sorted(every - ms) for name, ms in have.items() if every - ms}


def linear_shapes(cfg: ModelConfig, tp: int = 1) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear one TP rank runs, by name."""
    H, hd, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    up = 2 * I // tp if cfg.activation == "silu_glu" else I // tp
    return {"qkv_proj": ((cfg.num_heads + 2 * cfg.num_kv_heads) // tp * hd, H),
            "o_proj": (H, cfg.num_heads // tp * hd), "up_proj": (up, H), "down_proj": (H, I // tp),
            "lm_head": (cfg.padded_vocab_size(tp) // tp, H)}


def _time_graph_us(fn, copies: int, reps: int = 24) -> float:
    """Mean time of fn(i) over `reps` calls cycling through `copies` weight copies, captured in one
    graph: cycling keeps the weights out of L2 (50 MB on an H200), as in a real decode step."""
    fn(0)  # compile / warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with collected_garbage(), torch.cuda.graph(graph):
        for i in range(reps):
            fn(i % copies)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (3 * reps)


def _gemv_runner(x: torch.Tensor, ws: list[torch.Tensor], scale: torch.Tensor | None, norm: bool, glu: bool):
    """(run(i, config) -> output for weight copy i, the reference output for copy 0)."""
    from shardline.kernels.gemv import fused_linear, fused_linear_ref

    norm_weight = (torch.rand(x.shape[1], dtype=x.dtype, device=x.device) + 0.5) if norm else None
    residual = torch.randn_like(x) if norm else None
    reference = fused_linear_ref(x, ws[0], scale, None, norm_weight, residual, 1e-5, glu)[0]
    return (lambda i, cfg: fused_linear(x, ws[i], scale, None, norm_weight, residual, 1e-5, glu, cfg)[0]), reference


def agrees(out: torch.Tensor, reference: torch.Tensor, tol: float = 2e-2) -> bool:
    """A candidate's output is the reference's within `tol` of its largest magnitude (the kernels
    differ in summation order and, for int8/fp8, in where the scale is applied)."""
    out, reference = out.float(), reference.float()
    return out.shape == reference.shape and bool(
        torch.isfinite(out).all() and ((out - reference).abs().max() <= tol * reference.abs().max().clamp_min(1e-6)))


def tune(shapes: dict[str, tuple[int, int]], batches: list[int], x_dtype: torch.dtype, quantization: str,
         device: torch.device, quantized_names: set[str] | None = None) -> tuple[GemmTable, list[dict]]:
    """`quantization`: "none" or a weight-only scheme (kernels.quant.WEIGHT_ONLY), applied to the
    shapes in `quantized_names` (default: all)."""
    from shardline.kernels import gemv, quant
    from shardline.kernels._dispatch import hopper_or_later

    table = GemmTable(torch.cuda.get_device_name(device))
    report = []
    for name, (n, k) in shapes.items():
        quantised = quantization != "none" and (quantized_names is None or name in quantized_names)
        w = torch.randn(n, k, device=device, dtype=x_dtype) * 0.02
        scale = None
        if quantised:
            w, scale = quant.WEIGHT_ONLY[quantization][1](w)
            scale = scale.to(x_dtype)
        copies = max(1, -(-(256 << 20) // (w.numel() * w.element_size())))  # >= 256 MB of weights
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        for m in batches:
            x = torch.randn(m, k, device=device, dtype=x_dtype)
            if scale is None:
                default = lambda i: torch.nn.functional.linear(x, ws[i])  # noqa: E731
            else:
                default = lambda i: quant.quantized_linear(x, ws[i], scale)  # noqa: E731
            cublas_us = _time_graph_us(default, copies)
            best = {"impl": "cublas", "config": None, "us": cublas_us}
            reference = default(0)

            def split_k(cfg: dict):
                return lambda i: quant.small_m_linear(x, ws[i], scale, None, cfg)
            candidates = [("triton", cfg, split_k(cfg), reference) for cfg in triton_candidates(m, tma=hopper_or_later(x))]
            candidates += [("ring", cfg, lambda i, c=cfg: quant.ring_linear(x, ws[i], None, c), reference)
                           for cfg in ring_candidates(m, x, w, scale)]
            if 1 < m <= quant.STREAMK_MAX_M and x.dtype in (torch.float16, torch.bfloat16):
                candidates += [("streamk", cfg, lambda i, c=cfg: quant.streamk_linear(x, ws[i], scale, None, False, c),
                                reference) for cfg in streamk_candidates(m)]
            if gemv.fits(x, w) and name in GEMV_FUSION:
                run_gemv, gemv_reference = _gemv_runner(x, ws, scale, *GEMV_FUSION[name])
                candidates += [("gemv", cfg, lambda i, c=cfg: run_gemv(i, c), gemv_reference)
                               for cfg in gemv_candidates(x, w, scale)]
            gemv_best = None
            split_k_best: tuple[float, dict] | None = None

            def time_candidate(impl, cfg, fn, ref) -> float | None:
                try:
                    if not agrees(fn(0), ref):
                        log.warning("%s config %s: output differs from the reference; not a candidate", impl, cfg)
                        return None
                    return _time_graph_us(fn, copies)
                except Exception as e:  # noqa: BLE001 - a config that does not compile is not a candidate
                    log.warning("%s config %s failed: %s", impl, cfg, str(e).splitlines()[0] if str(e) else e)
                    return None

            for impl, cfg, fn, ref in candidates:
                us = time_candidate(impl, cfg, fn, ref)
                if us is None:
                    continue
                if impl == "gemv":
                    gemv_best = us if gemv_best is None else min(gemv_best, us)
                if impl == "triton" and (split_k_best is None or us < split_k_best[0]):
                    split_k_best = (us, cfg)
                if us < best["us"]:
                    best = {"impl": impl, "config": cfg, "us": us}
            if split_k_best is not None:  # the best split-K tile, its stream reaching further ahead
                for cfg in ahead_candidates(split_k_best[1]):
                    us = time_candidate("triton", cfg, split_k(cfg), reference)
                    if us is not None and us < best["us"]:
                        best = {"impl": "triton", "config": cfg, "us": us}
            best["cublas_us"] = cublas_us
            best["gemv_us"] = gemv_best
            table.entries.setdefault(key(n, k, w.dtype, x_dtype), {})[m] = best
            row = {"name": name, "N": n, "K": k, "M": m, "w": str(w.dtype).removeprefix("torch."),
                   "default_us": round(cublas_us, 2), "best_us": round(best["us"], 2), "impl": best["impl"],
                   "gemv_us": gemv_best and round(gemv_best, 2),
                   "gain": round(cublas_us / best["us"], 3)}
            report.append(row)
            print(json.dumps(row), flush=True)
    return table, report


# -- `shardline tune-gemm` ------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", choices=["llama3-8b", "gptj-6b"], help="a built-in model shape")
    p.add_argument("--model", help="a converted model directory (its manifest gives the shapes)")
    p.add_argument("--tp", type=int, default=None, help="default: the model's, or 1")
    # Each decode batch bucket takes the next larger tuned batch's entries: rows 17-32 on the 64-row
    # entries ran 10% slower a step than 64 rows on the H200 (docs/benchmarks-history.md), hence 32.
    p.add_argument("--batches", default="1,16,32,64,256")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    quant = p.add_mutually_exclusive_group()
    quant.add_argument("--int8", action="store_true", help="tune int8 weight-only projections")
    quant.add_argument("--fp8", action="store_true", help="tune fp8 (e4m3) weight-only projections")
    p.add_argument("--in-step", action="store_true",
                   help="then refine each batch's choices (<= 64 rows) in the captured decode step of a one-stage engine "
                        "on random weights of the shape (shardline/step_tuning.py; minutes a batch; --tp 1 only)")
    p.add_argument("--step-rounds", type=int, default=2, help="--in-step: alternating rounds a candidate")
    p.add_argument("--step-margin", type=float, default=0.003,
                   help="--in-step: the relative gain in step time a change of choice needs")
    p.add_argument("--out", required=True)


def run(args: argparse.Namespace) -> int:
    from shardline.manifest import Manifest
    from shardline.model.random_weights import SHAPES

    if bool(args.shape) == bool(args.model):
        print("shardline tune-gemm: error: give exactly one of --shape or --model", file=sys.stderr)
        return 2
    if args.model:
        m = Manifest.read(args.model)
        cfg, tp, quantization = m.model, args.tp or m.tp, m.quantization
    else:
        cfg, tp, quantization = ModelConfig(**SHAPES[args.shape]), args.tp or 1, "none"
    if args.int8 or args.fp8:
        quantization = "int8-weight-only" if args.int8 else "fp8-weight-only"
    from shardline import step_tuning  # imports this module: not at the top
    problem = step_tuning.settings_error(args.step_rounds, args.step_margin) if args.in_step else None
    if problem:
        print(f"shardline tune-gemm: error: --step-rounds / --step-margin: {problem}", file=sys.stderr)
        return 2
    if args.in_step and tp != 1:
        print(f"shardline tune-gemm: error: --in-step times the step of a one-rank engine, and these shapes are "
              f"tp={tp}'s (a rank's step also all-reduces); tune them without --in-step", file=sys.stderr)
        return 2
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        print(f"shardline tune-gemm: error: --batches {args.batches!r}: give row counts >= 1, comma-separated, "
              "e.g. --batches 1,16,32,64,256", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:  # an existing file takes the new entries (one file can hold several models' shapes)
        if out.is_file():
            GemmTable.checked(out)
    except ConfigError as e:
        print(f"shardline tune-gemm: error: --out {out} exists, and the new entries would be merged into it: {e}; "
              "or give another --out", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("shardline tune-gemm: error: needs a CUDA GPU; the file it writes is per GPU model", file=sys.stderr)
        return 2
    old = GemmTable.load(out, torch.device("cuda")) if out.is_file() else None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    table, report = tune(linear_shapes(cfg, tp), batches, dtype, quantization, torch.device("cuda"),
                         quantized_names={"qkv_proj", "o_proj", "up_proj", "down_proj"})
    if old is not None:
        for k, d in old.entries.items():
            table.entries.setdefault(k, {}).update({m: v for m, v in d.items() if m not in table.entries.get(k, {})})
    table.save(out)
    if args.in_step:
        small = [b for b in batches if b <= step_tuning.IN_STEP_MAX_M]
        if not small:
            print(f"--in-step: no batch of at most {step_tuning.IN_STEP_MAX_M} rows in --batches {args.batches}; "
                  "nothing to refine (above that cuBLAS is the choice)")
        else:
            engine = step_tuning.random_engine(cfg, args.dtype, quantization, max_num_seqs=max(small + [16]))
            table = step_tuning.refine(engine, table, small, cfg, dtype, rounds=args.step_rounds,
                                       margin=args.step_margin)
            table.save(out)
            print(f"refined the choices of batches {small} in the decode step; wrote {out}")
    total_default = sum(r["default_us"] for r in report)
    total_best = sum(r["best_us"] for r in report)
    print(f"tuned {len(report)} (shape, M) pairs on {table.gpu}: sum {total_default:.1f} us -> {total_best:.1f} us "
          f"({total_default / total_best:.2f}x); wrote {out}")
    return 0
