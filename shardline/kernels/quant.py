"""Weight-only quantized linear: y = x @ (w_q * scale[:, None]).T + bias.

w_q [out, in] is int8 or fp8 (e4m3) with a per-output-channel scale [out] (docs/shard-format.md).
The reference dequantises; the GPU kernels stream the 1-byte weights and scale in the epilogue,
halving the bytes a memory-bound decode step reads. Both schemes share every kernel: they differ
only in how a weight byte widens to a float.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._dispatch import sm_count, use_triton
from .norm import RowNorm, sum_squares_ref


def quantized_linear_ref(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    w = w_q.to(x.dtype) * scale.to(x.dtype)[:, None]
    return torch.nn.functional.linear(x, w, bias)


def linear_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """The reference of the decode GEMMs: the product (dequantised when `scale` is given), then
    with `glu` silu(gate) * up of the fused [gate; up] output."""
    from .activation import silu_and_mul_ref
    y = quantized_linear_ref(x, weight, scale, bias) if scale is not None else torch.nn.functional.linear(x, weight, bias)
    return silu_and_mul_ref(y) if glu else y


def _check_glu(weight: torch.Tensor, glu: bool, out_dtype: torch.dtype | None = None) -> None:
    if glu and weight.shape[0] % 2:
        raise ValueError(f"glu needs the fused [gate; up] weight, an even row count; got {weight.shape[0]} rows")
    if glu and out_dtype is not None:
        raise ValueError("out_dtype is for the plain product; SwiGLU's output is x's dtype")


def _reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
               glu: bool, out_dtype: torch.dtype | None, norm: RowNorm | None = None,
               residual: torch.Tensor | None = None, centre: torch.Tensor | None = None, sums: bool = False):
    """linear_ref in `out_dtype`: what the decode GEMMs compute where their kernels do not run;
    with the fold of `norm` (and a LayerNorm's `centre`) and `residual` (and `sums`), the sums in
    fp32 and rounded where the kernels round."""
    if norm is None and residual is None:
        y = linear_ref(x, weight, scale, bias, glu)
        return y if out_dtype is None else y.to(out_dtype)
    acc = torch.promote_types(x.dtype, torch.float32)  # the kernels' fp32 sums (fp64 stays fp64)
    w = weight.to(acc) * scale.to(acc)[:, None] if scale is not None else weight.to(acc)
    y = torch.nn.functional.linear(x.to(acc), w)
    if norm is not None:
        rows = (*y.shape[:-1], 1)
        if norm.sums is not None:  # W (x - mean) = W x - mean * (W's row sums)
            y = y - norm.mean(x.shape[-1]).to(acc).reshape(rows) * centre.to(acc)
        y = y * norm.rstd(x.shape[-1]).to(acc).reshape(rows)
    if bias is not None:
        y = y + bias.to(acc)
    if glu:
        from .activation import silu_and_mul_ref
        y = silu_and_mul_ref(y.to(x.dtype))
    if residual is None:
        return y.to(out_dtype or x.dtype)
    s = (y.to(x.dtype).to(acc) + residual.to(acc)).to(x.dtype)
    return s, sum_squares_ref(s, sums)


def _check_fold(glu: bool, out_dtype: torch.dtype | None, residual: torch.Tensor | None,
                norm: RowNorm | None = None, centre: torch.Tensor | None = None, n: int = 0,
                sums: bool = False) -> None:
    if residual is not None and (glu or out_dtype is not None):
        raise ValueError("the residual add follows a plain product in x's dtype: no glu, no out_dtype")
    if sums and residual is None:
        raise ValueError("sums are the stream's, which a product leaves only with the residual add")
    if norm is not None and norm.sums is not None:
        if centre is None:
            raise ValueError("a LayerNorm's fold needs the product's centre (its weight's row sums, "
                             "Linear.centre): fold the norm with fold_layer_norm first")
        if centre.shape != (n,) or centre.dtype != torch.float32:
            raise ValueError(f"centre must be fp32 [{n}] (a weight row's sum each), got {centre.dtype} "
                             f"{list(centre.shape)}")


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


FP8_MAX = 448.0  # the largest float8_e4m3fn


def quantize_fp8_ref(w: torch.Tensor, scale_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel e4m3: `w [out, in]` -> (float8_e4m3fn `[out, in]`, `scale [out]`),
    w ≈ q * scale, with `scale = max|w_row| / 448` rounded to `scale_dtype` first (as for int8)."""
    wf = w.float()
    scale = (wf.abs().amax(dim=1) / FP8_MAX).to(scale_dtype or w.dtype)
    divisor = scale.float()
    divisor = torch.where(divisor == 0, torch.ones_like(divisor), divisor)
    q = (wf / divisor[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def quantize_int8_ref(w: torch.Tensor, scale_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel: `w [out, in]` -> (int8 `[out, in]`, `scale [out]`), w ≈ q * scale.

    `scale = max|w_row| / 127`, rounded to `scale_dtype` (default: w's dtype) before q is
    computed, so the engine's dequantisation with the stored scale is the one the rounding chose.
    The converter and the benchmarks' random weights both quantise through this function.
    """
    wf = w.float()
    scale = (wf.abs().amax(dim=1) / 127).to(scale_dtype or w.dtype)
    divisor = scale.float()
    divisor = torch.where(divisor == 0, torch.ones_like(divisor), divisor)  # all-zero rows stay zero
    q = torch.round(wf / divisor[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


# Manifest `quantization` -> (stored weight dtype, quantiser). "none" stores the model dtype.
WEIGHT_ONLY = {"int8-weight-only": (torch.int8, quantize_int8_ref),
               "fp8-weight-only": (torch.float8_e4m3fn, quantize_fp8_ref)}


def quantized_linear(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    if use_triton(x):
        from .triton_quant import quantized_linear_triton
        return quantized_linear_triton(x, w_q, scale, bias)
    return quantized_linear_ref(x, w_q, scale, bias)


@dataclass
class GreedyIds:
    """Where a head product leaves each row's greedy id: `out` int64 [M], the first maximum among
    the product's first `cols` columns (the real vocabulary of a padded head).

    `store` (int64 [1] on the product's device, or None): where it holds 0, no one reads this
    call's logits (a decode graph's step in which every row is greedy, cuda_graphs.py), and a
    product that leaves the ids from its epilogue skips writing them: the returned logits are then
    whatever the buffer held. Products that take the ids from the logits write them whatever it
    holds."""

    out: torch.Tensor
    cols: int
    store: torch.Tensor | None = None

    def take(self, y: torch.Tensor) -> None:
        """Write them from a product `y` [M, >= cols] already computed (where no epilogue did)."""
        from .argmax import argmax_rows
        argmax_rows(y[:, :self.cols], out=self.out)


def small_m_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                   bias: torch.Tensor | None, config: dict, glu: bool = False,
                   out_dtype: torch.dtype | None = None, norm: RowNorm | None = None,
                   residual: torch.Tensor | None = None, greedy: GreedyIds | None = None, gelu: bool = False,
                   centre: torch.Tensor | None = None, sums: bool = False):
    """The split-K small-M kernel with a tuned `config` (shardline tune-gemm), for int8 or fp8
    (with scale) or x-dtype weights; the plain product where Triton does not run. With `glu`,
    W is the fused [gate; up] projection and the result silu(gate) * up. `out_dtype` (not with
    `glu`): the result's dtype if not x's; the kernel writes it from its fp32 sums (the logits
    need no conversion kernel after it).

    The fold (Llama's decode at batch > 1, model/transformer.py): `norm` scales x's rows by
    1 / rms in the epilogue (the RMSNorm before this product, its weight folded into W);
    `residual` adds the stream to the product there and returns (the stream's next value, its
    partial sums of squares), the next product's `norm`. GPT-J's LayerNorm folds the same way:
    a `norm` with sums centres the rows too, by the product's `centre` (fp32 [N], each weight
    row's sum), and `sums` has the residual product leave the stream's partial sums beside its
    squares ([2, tiles, M], norm.RowNorm.of).

    `greedy` (not with `residual`): each row's argmax of the result, written to greedy.out; the
    kernel's epilogue leaves each tile's maximum, so no pass over the result follows (the head's
    logits at greedy decode). `gelu`: the result is gelu_tanh(the product + bias), rounded where
    the product and then activation.gelu_tanh would round (GPT-J's and GPT-2's up projection)."""
    _check_glu(weight, glu, out_dtype)
    _check_fold(glu, out_dtype, residual, norm, centre, weight.shape[0], sums)
    if gelu and (glu or out_dtype is not None or residual is not None or greedy is not None):
        raise ValueError("gelu follows a plain product in x's dtype: no glu, out_dtype, residual or greedy")
    if greedy is not None and (residual is not None or glu or x.dim() != 2
                               or greedy.out.shape != (x.shape[0],) or greedy.out.dtype != torch.int64):
        raise ValueError("greedy ids come from a plain product of rows [M, K] into int64 [M]")
    if use_triton(x):
        from .triton_quant import small_m_linear_triton
        return small_m_linear_triton(x, weight, scale, bias, config, glu, out_dtype, norm, residual, greedy, gelu,
                                     centre, sums)
    y = _reference(x, weight, scale, bias, glu, out_dtype, norm, residual, centre, sums)
    if gelu:
        from .activation import gelu_tanh_ref
        y = gelu_tanh_ref(y)
    if greedy is not None:
        greedy.take(y)
    return y


STREAMK_MAX_M = 64  # above this a decode product is compute-bound: cuBLAS


def streamk_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, glu: bool = False, config: dict | None = None) -> torch.Tensor:
    """y = x @ W.T [* scale] [+ bias] for 1..64 rows of x, by the stream-K kernel
    (triton_streamk.py); with `glu`, W is the fused [gate; up] projection and y = silu(gate) * up."""
    rows = _rows(x)
    if rows > STREAMK_MAX_M:
        raise ValueError(f"the stream-K kernel takes at most {STREAMK_MAX_M} rows, got {rows}: "
                         "use cuBLAS (torch.nn.functional.linear) above that")
    _check_glu(weight, glu)
    if use_triton(x) and x.dtype in (torch.float16, torch.bfloat16):
        from .triton_streamk import streamk_linear_triton
        return streamk_linear_triton(x, weight, scale, bias, glu, config)
    return linear_ref(x, weight, scale, bias, glu)


RING_MAX_M = 64  # the ring GEMM's x tile: one warpgroup's wgmma rows


def ring_fits(x: torch.Tensor, w: torch.Tensor) -> str | None:
    """Why the ring GEMM cannot take the operands, or None when it can (TMA: 16-byte aligned bases
    and row strides, contiguous rows)."""
    M = _rows(x)
    if M > RING_MAX_M:
        return f"{M} rows: the ring GEMM takes at most {RING_MAX_M} (above that the product is compute-bound)"
    if x.dtype not in (torch.float16, torch.bfloat16) or w.dtype != x.dtype:
        return f"x {x.dtype} and weights {w.dtype}: the ring GEMM takes bf16 or fp16 weights of x's dtype"
    if (x.shape[-1] * x.element_size()) % 16:
        return f"K = {x.shape[-1]}: a row must be a multiple of 16 bytes (TMA); pad K or use the split-K kernel"
    if w.stride(-1) != 1 or (w.stride(0) * w.element_size()) % 16 or w.data_ptr() % 16:
        return "the weight's rows must be contiguous and 16-byte aligned (TMA); pass a contiguous copy"
    return None


# What a tune-gemm table's split-K entry (impl "triton") may hold: the tile, the K splits, Triton's
# launch options and the kernel's switches (triton_quant._int8_linear_kernel). Without BLOCK_M the
# kernel takes 16 rows a tile up to 16 rows, else 64; without SPLIT_K one split.
SPLIT_K_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages", "TMA", "PREFETCH", "AHEAD",
                "LATE")
_TILE_SIDES = (16, 32, 64, 128, 256)


def split_k_config(config: dict) -> dict:
    """`config` (a tune-gemm table's entry for the split-K kernel) when the kernel can take it,
    else a ValueError that names the key or value and what it takes, before Triton would fail to
    compile it at the first step."""
    unknown = set(config) - set(SPLIT_K_KEYS)
    if unknown:
        raise ValueError(f"split-K config keys {sorted(unknown)} unknown; it takes {', '.join(SPLIT_K_KEYS)}")
    missing = [k for k in ("BLOCK_N", "BLOCK_K") if k not in config]
    if missing:
        raise ValueError(f"split-K config {config} lacks {', '.join(missing)}: the tile's weight rows and K columns")

    def bad(name: str, ok: bool, takes: str) -> None:
        if name in config and not (type(config[name]) in (int, bool) and ok):
            raise ValueError(f"split-K config {name}={config[name]!r}: {takes}")

    get = config.get
    bad("BLOCK_M", get("BLOCK_M") in _TILE_SIDES, f"x rows a tile, one of {', '.join(map(str, _TILE_SIDES))}")
    bad("BLOCK_N", get("BLOCK_N") in _TILE_SIDES, f"weight rows a tile, one of {', '.join(map(str, _TILE_SIDES))}")
    bad("BLOCK_K", get("BLOCK_K") in _TILE_SIDES, f"K columns a tile, one of {', '.join(map(str, _TILE_SIDES))}")
    bad("SPLIT_K", isinstance(get("SPLIT_K"), int) and get("SPLIT_K") >= 1, "the K splits, an integer >= 1")
    bad("num_warps", get("num_warps") in (1, 2, 4, 8, 16), "one of 1, 2, 4, 8, 16")
    bad("num_stages", isinstance(get("num_stages"), int) and get("num_stages") >= 1, "an integer >= 1")
    for flag in ("TMA", "LATE"):
        bad(flag, get(flag) in (0, 1), "0 or 1")
    for ahead in ("PREFETCH", "AHEAD"):
        bad(ahead, isinstance(get(ahead), int) and get(ahead) >= 0, "weight tiles asked of L2 ahead, an integer >= 0")
    return config


# 128 weight rows a program (64 + 64 with GLU), 128-column K tiles, three stages (144 KB of shared
# memory: one program a multiprocessor), all of them requested before the PDL wait (EARLY, by
# default STAGES).
RING_DEFAULT_CONFIG = dict(BLOCK_N=128, BLOCK_K=128, STAGES=3, SPLIT_K=1)
RING_KEYS = ("BLOCK_N", "BLOCK_K", "STAGES", "SPLIT_K", "EARLY", "SUB", "WAVES", "MAXNREG", "LATE")
RING_SMEM_BYTES = 227 * 1024  # a Hopper block's shared memory at most (the barriers take a few bytes)


def ring_config(config: dict | None) -> dict:
    """RING_DEFAULT_CONFIG updated with `config` (a tune-gemm table's entry), or a ValueError that
    names the key or value the ring GEMM cannot take.

    SUB > 0 is the balanced form: the rows are dealt to WAVES programs a multiprocessor (default 1)
    in runs of SUB rows, as evenly as whole runs allow, so that every program streams the same
    bytes whatever N is (the tiled form leaves a partial last wave: 224 programs of gate/up are
    1.7 waves on 132 multiprocessors); BLOCK_N then follows from N (ring_plan), and K is not split.

    LATE: the kernel after this one may launch once every program has finished its loop, instead of
    right after its PDL wait (triton_pdl.pdl_wait; the split-K kernel takes the same key).

    MAXNREG caps the registers a thread at launch (0: no cap). Uncapped the ring launches at 255 for
    its 256 threads, the whole register file, so no other program fits beside it; 128 leaves half,
    for a second program of its own or of a neighbouring kernel (benchmarks/ring_resources.py)."""
    unknown = set(config or {}) - set(RING_KEYS)
    if unknown:
        raise ValueError(f"ring GEMM config keys {sorted(unknown)} unknown; it takes {', '.join(RING_KEYS)} "
                         "(re-run `shardline tune-gemm`)")
    cfg = dict(RING_DEFAULT_CONFIG, **(config or {}))
    if cfg["BLOCK_N"] not in (32, 64, 128, 256) or cfg["BLOCK_K"] not in (32, 64, 128):
        raise ValueError(f"ring GEMM tile BLOCK_N={cfg['BLOCK_N']}, BLOCK_K={cfg['BLOCK_K']}: BLOCK_N must be one "
                         "of 32, 64, 128, 256 (halved under SwiGLU) and BLOCK_K one of 32, 64, 128")
    if cfg["STAGES"] < 1 or cfg["SPLIT_K"] < 1 or cfg.get("EARLY", 0) < 0:
        raise ValueError(f"ring GEMM STAGES={cfg['STAGES']}, SPLIT_K={cfg['SPLIT_K']}, EARLY={cfg.get('EARLY')}: "
                         "STAGES and SPLIT_K must be >= 1, EARLY >= 0")
    if cfg.get("SUB", 0) not in (0, 8, 16, 32, 64) or cfg.get("WAVES", 1) < 1:
        raise ValueError(f"ring GEMM SUB={cfg.get('SUB')}, WAVES={cfg.get('WAVES')}: SUB is 0 (tiles of "
                         "BLOCK_N) or the rows of a run, one of 8, 16, 32, 64; WAVES (programs a multiprocessor) >= 1")
    if cfg.get("LATE", 0) not in (0, 1, False, True):
        raise ValueError(f"ring GEMM LATE={cfg['LATE']!r}: 0 (the next kernel may launch after this one's PDL wait) "
                         "or 1 (after its main loop)")
    if cfg.get("MAXNREG", 0) and not (cfg["MAXNREG"] % 8 == 0 and 64 <= cfg["MAXNREG"] <= 248):
        raise ValueError(f"ring GEMM MAXNREG={cfg['MAXNREG']}: 0 (no cap) or a multiple of 8 from 64 to 248 "
                         "(the warp groups trade registers in steps of 8)")
    if cfg.get("SUB", 0) and cfg["SPLIT_K"] != 1:
        raise ValueError(f"ring GEMM SUB={cfg['SUB']} with SPLIT_K={cfg['SPLIT_K']}: the balanced form does not "
                         "split K; drop SPLIT_K or SUB")
    return cfg


def ring_plan(cfg: dict, n: int, k: int, glu: bool, elem_bytes: int, num_sms: int) -> dict:
    """How a validated ring config runs N output rows (gate rows under `glu`) over K: the rows a
    program covers (BLOCK_N, each half under `glu`), the weight box TMA loads (BOX rows), the grid,
    and for the balanced form the row runs and programs; a ValueError when the tile cannot fit."""
    block_k, stages = cfg["BLOCK_K"], cfg["STAGES"]
    sub = cfg.get("SUB", 0)
    if sub:
        runs = -(-n // sub)
        programs = min(cfg.get("WAVES", 1) * num_sms, runs)
        per = -(-runs // programs)
        block_n = max(sub * (1 << (per - 1).bit_length()), 16)  # a power of two, at least wgmma's 16
        if block_n > 256:
            raise ValueError(f"ring GEMM SUB={sub}: {n} rows over {programs} programs is {per} runs of {sub} "
                             f"a program, {block_n} rows, above wgmma's 256; raise WAVES")
        plan = dict(BLOCK_N=block_n, BOX=sub, grid=(programs, 1), runs=runs, programs=programs)
    else:
        block_n = cfg["BLOCK_N"] // 2 if glu else cfg["BLOCK_N"]
        plan = dict(BLOCK_N=block_n, BOX=block_n, grid=(-(-n // block_n), cfg["SPLIT_K"]), runs=0, programs=0)
    smem = stages * (RING_MAX_M + (2 if glu else 1) * block_n) * block_k * elem_bytes
    if smem > RING_SMEM_BYTES:
        raise ValueError(f"ring GEMM {block_n} rows{' x 2 (SwiGLU)' if glu else ''} by {block_k} over {stages} "
                         f"stages needs {smem // 1024} KB of shared memory, above {RING_SMEM_BYTES // 1024}; "
                         "fewer STAGES or a smaller BLOCK_K")
    return plan


def ring_available(x: torch.Tensor) -> bool:
    """The ring GEMM (gluon_ring.py) runs for x: a Hopper or later GPU, and Triton with Gluon."""
    from ._dispatch import gluon_available, hopper_or_later
    return use_triton(x) and x.is_cuda and hopper_or_later(x) and gluon_available()


def exp12_linear(x: torch.Tensor, packed, bias: torch.Tensor | None = None, config: dict | None = None,
                 norm: RowNorm | None = None, residual: torch.Tensor | None = None):
    """y = x @ W.T [+ bias] for 1..64 bf16 rows of x, W in the 12-bit form (exp12.Exp12Weight,
    whose product is the bf16 weight's); with packed.glu W is the fused [gate; up] projection and
    y = silu(gate) * up; `norm` and `residual` the RMSNorm fold, as small_m_linear's (with
    `residual`: (the stream, its partial sums of squares)). By gluon_exp12.py on Hopper with
    Gluon, else the reference on the weight the form holds."""
    from .exp12 import exp12_config
    cfg = exp12_config(config)
    rows, k = packed.shape
    if x.shape[-1] != k or x.dtype != torch.bfloat16 or _rows(x) > RING_MAX_M:
        raise ValueError(f"the 12-bit product takes 1..{RING_MAX_M} bf16 rows of {k} columns; got {x.dtype} "
                         f"{tuple(x.shape)}: use the bf16 weight's kernels for these rows")
    if norm is not None and norm.sums is not None:
        raise ValueError("the 12-bit product folds an RMSNorm only, not a LayerNorm: keep the weight in bf16")
    _check_fold(packed.glu, None, residual, norm, None, rows // 2 if packed.glu else rows)
    if (why := packed.unfit(cfg)) is not None:  # a split without a K tile, or more corrections than its list
        raise ValueError(why)
    if ring_available(x):
        from .gluon_exp12 import exp12_linear_gluon
        return exp12_linear_gluon(x, packed, bias, cfg, norm, residual)
    return _reference(x, packed.weight(), None, bias, packed.glu, None, norm, residual)


def ring_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                config: dict | None = None, glu: bool = False, out_dtype: torch.dtype | None = None,
                norm: RowNorm | None = None, residual: torch.Tensor | None = None,
                centre: torch.Tensor | None = None, sums: bool = False):
    """y = x @ W.T [+ bias] for 1..64 rows of x, bf16 or fp16 weights of x's dtype, by the ring GEMM
    (gluon_ring.py: weights streamed before the PDL wait by a producer warp); with `glu`, W is the
    fused [gate; up] projection and y = silu(gate) * up. The reference off Hopper or without Gluon.
    `norm`, `residual`, `centre` and `sums`: the fold, as small_m_linear's."""
    _check_glu(weight, glu, out_dtype)
    _check_fold(glu, out_dtype, residual, norm, centre, weight.shape[0], sums)
    config = ring_config(config)  # a bad table entry fails the same way on every device ...
    n, k = weight.shape
    plan = ring_plan(config, n // 2 if glu else n, k, glu, 2, sm_count(x))  # ... as does one that cannot fit
    if ring_available(x):  # operands it cannot take are a ValueError naming why (ring_fits: 16-bit only)
        from .gluon_ring import ring_linear_gluon
        return ring_linear_gluon(x, weight, bias, config, plan, glu, out_dtype, norm, residual, centre, sums)
    return _reference(x, weight, None, bias, glu, out_dtype, norm, residual, centre, sums)
