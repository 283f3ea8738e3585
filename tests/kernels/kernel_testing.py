"""Helpers shared by the kernel tests (a plain module, so its name cannot clash with another conftest)."""

from __future__ import annotations

import pytest
import torch

from shardline.kernels.norm import RowNorm

# ||out - ref|| / ||ref|| allowed for a Triton kernel vs its reference, by dtype.
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_close(out: torch.Tensor, ref: torch.Tensor, what: str, tol: float | None = None) -> None:
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} != reference {ref.dtype}"
    assert torch.isfinite(out).all(), f"{what}: non-finite values (an unwritten or NaN output)"
    err = rel_err(out, ref)
    tol = REL_TOL[ref.dtype] if tol is None else tol
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e} against the reference"


def assert_exact(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """Bit-exact on the GPU. Triton's interpreter truncates fp32 -> bf16 instead of rounding to
    nearest, so interpreted bf16 results may differ by one ulp there."""
    if out.is_cuda or out.dtype != torch.bfloat16:
        assert torch.equal(out, ref), f"{what}: not bit-identical to the reference"
    else:
        assert_close(out, ref, what)


# A rotated key may differ from the reference's by an ulp of its dtype, and so its e4m3 by one step;
# near zero it is a difference of two products (x cos - y sin), each rounded to bf16 (kernels/
# rotary.py), so it may be off by the products' rounding: up to 2^-7 for inputs of magnitude ~1.
ROTATED_ATOL = 2.0 ** -7


def assert_fp8_matches(out: torch.Tensor, ref: torch.Tensor, what: str, ulps: int = 0, atol: float = 0.0) -> None:
    """e4m3 tensors equal, byte for byte, or within `ulps` steps of the format (the step of the
    larger of the two; across zero, the subnormals' 2^-9) or `atol`, on the GPU. Triton's interpreter rounds to e4m3 its own way (no carry into the exponent, so a value
    that rounds up to a power of two comes out as half of it; subnormals steps off), so off the GPU
    each value need only be within a factor of two of the reference's (or `atol`): the slots and the
    saturation are checked there, the rounding on the GPU."""
    assert out.shape == ref.shape and out.dtype == ref.dtype == torch.float8_e4m3fn, what
    if out.is_cuda:
        of, rf = out.float(), ref.float()
        exponent = torch.maximum(of.abs(), rf.abs()).clamp_min(2.0 ** -6).log2().floor()
        step = torch.exp2(exponent - 3)  # e4m3 keeps three mantissa bits
        ok = (out.view(torch.uint8) == ref.view(torch.uint8)) | ((of - rf).abs() <= torch.clamp_min(ulps * step, atol))
        detail = f"by more than {ulps} ulp(s)"
    else:
        of, rf = out.float(), ref.float()
        tiny = 2.0 ** -6  # e4m3's subnormals
        ok = ((of.abs() <= tiny) & (rf.abs() <= tiny)) | ((of * rf > 0) & (of / rf <= 2) & (rf / of <= 2))
        if atol:  # the products' rounding, then a step of the interpreter's own rounding near zero
            ok |= (of - rf).abs() <= atol + 2.0 ** -9
        detail = f"by more than a factor of two or {atol} (interpreted)"
    bad = (~ok).sum().item()
    pairs = list(zip(out.float()[~ok].tolist()[:4], ref.float()[~ok].tolist()[:4]))
    assert bad == 0, f"{what}: {bad} of {ok.numel()} e4m3 values differ from the reference {detail}: {pairs}"


def poison_allocator(*like: torch.Tensor) -> None:
    """Free NaN-filled blocks of these sizes, so that the caching allocator hands one to the next
    output of that size: an element the kernel fails to write then reads NaN, not a stale value."""
    for t in like:
        del_me = torch.full_like(t, float("nan"))
        del del_me


def skip_interpreted_bf16_dot(device: str, dtype: torch.dtype) -> None:
    """Triton's interpreter runs tl.dot on bf16 as a matmul of the raw uint16 bit patterns."""
    if device != "cuda" and dtype == torch.bfloat16:
        pytest.skip("bf16 tl.dot is wrong in Triton's interpreter; checked on the GPU only")


def assert_graph_replays_deterministic(fn, x: torch.Tensor, reference, what: str) -> None:
    """fn(x), captured in a CUDA graph after one eager call (which compiles and allocates any
    workspace outside the capture), replays bit-identical to the eager output, and on new input
    in x matches reference(x)."""
    first = fn(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(x)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first), f"{what}: a replay differs from the eager call (summation order)"
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference(x), f"{what} replayed on new input")


def fold_problem(M, N, K, dtype, device, parts=5, layer_norm=False):
    """A stream s [M, K] with its sums of squares in `parts` partials, an RMSNorm weight g, a
    weight W [N, K] and a residual [M, N]: the fold's operands and the unfused path's. With
    `layer_norm`, the stream sits off zero and its RowNorm has the partial sums too, one [2,
    parts, M] tensor as a residual product leaves them."""
    s = torch.randn(M, K, device=device, dtype=dtype)
    if layer_norm:
        s = (s + torch.randn(M, 1, device=device, dtype=dtype)).to(dtype)
    cuts = torch.linspace(0, K, parts + 1).long().tolist()
    chunks = [s[:, a:b].float() for a, b in zip(cuts, cuts[1:])]
    ss = torch.stack([c.pow(2).sum(-1) for c in chunks])
    if layer_norm:
        norm = RowNorm.of(torch.stack([ss, torch.stack([c.sum(-1) for c in chunks])]).contiguous(), 1e-5)
    else:
        norm = RowNorm(ss.contiguous(), 1e-5)
    g = (torch.rand(K, device=device) + 0.5).to(dtype)
    w = (torch.randn(N, K, device=device) * 0.05).to(dtype)
    residual = torch.randn(M, N, device=device, dtype=dtype)
    return s, norm, g, w, residual


def fold_case(fold: str, M, N, K, dtype, device, parts=5):
    """A fold test's operands by its id, and the reference's answer: 'norm', 'residual', 'both'
    (the norm before the product, the residual add after it, both), 'norm-glu' (SwiGLU over the
    doubled weight) and a LayerNorm's 'ln', 'ln-residual', 'ln-both', 'ln-glu', 'ln-gelu' (rows
    centred by the weight's row sums; with the residual, the stream's sums left after its
    squares). Returns (s, w, the product's keywords, glu, gelu, want)."""
    from shardline.kernels.activation import gelu_tanh_ref
    from shardline.kernels.quant import _reference
    ln = fold.startswith("ln")
    s, norm, _, w, residual = fold_problem(M, N, K, dtype, device, parts=parts, layer_norm=ln)
    glu, gelu = fold.endswith("glu"), fold == "ln-gelu"
    if glu:
        w = torch.cat([w, w.flip(0)])
    with_norm, with_residual = not fold.endswith("residual"), fold.endswith(("residual", "both"))
    kw = dict(norm=norm if with_norm else None, residual=residual if with_residual else None)
    if ln:
        kw |= dict(centre=w.float().sum(1) if with_norm else None, sums=with_residual)
    want = _reference(s, w, None, None, glu, None, **kw)
    return s, w, kw, glu, gelu, gelu_tanh_ref(want) if gelu else want


def assert_fold_close(got, want, what: str) -> None:
    """A fold's output against the reference's: the product, or with the residual add the
    stream and its partial sums (of squares, [tiles, M]; and of values, [2, tiles, M]) summed
    over the tiles, which the kernel and the reference cut differently."""
    if not isinstance(want, tuple):
        assert_close(got, want, what)
        return
    assert_close(got[0], want[0], f"{what} stream")
    assert got[1].shape[:-2] == want[1].shape[:-2], f"{what}: sums {tuple(got[1].shape)} != {tuple(want[1].shape)}"
    assert_close(got[1].sum(-2), want[1].sum(-2), f"{what} sums (of squares)", tol=1e-4)
