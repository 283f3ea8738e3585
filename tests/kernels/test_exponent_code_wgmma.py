"""benchmarks/exponent_code_wgmma.py: the 12-bit form stored for the wgmma's register operand holds
every weight in its window exactly, its word-wise decode (emulated here in torch as the kernel's
instructions run) gives back the weight, the kernel compiles for sm_90 on any machine with its
rebuild costing no data movement, and on a Hopper GPU it multiplies by exactly that weight."""

from __future__ import annotations

import pytest
import torch

from benchmarks.exponent_code_wgmma import _column_of_position, decode_words, pack, unpack


def _weight(n: int, k: int, device: str = "cpu") -> torch.Tensor:
    # drawn in fp32, then rounded: unseeded bf16 normal_ put 0.6% below the window on the GPU machine's CPU
    # (torch 2.11), against ~1e-4 here
    g = torch.Generator().manual_seed(n * k)
    w = (torch.randn(n, k, generator=g) * 0.02).to(device=device, dtype=torch.bfloat16)
    w[1, 3], w[2, 5], w[0, 0] = 0.0, 1e-9, -0.11  # a zero and a tiny one fall below; the largest sets the base
    return w


def test_the_form_is_exact_in_its_window_and_below_it_holds_the_window_floor():
    w = _weight(96, 512)
    b_plane, n_plane, base, below = pack(w)
    assert b_plane.shape == (96, 512) and n_plane.shape == (96, 256)
    assert base % 2 == 0 and base <= 123 <= base + 15  # -0.11's exponent field is 123
    back = unpack(b_plane, n_plane, base)
    assert torch.equal(back[~below].view(torch.int16), w[~below].view(torch.int16))
    assert below[1, 3] and below[2, 5] and not below[0, 0]
    floor = torch.tensor([base << 7], dtype=torch.int16).view(torch.bfloat16)
    assert (back[below] == floor).all()
    assert below.float().mean().item() < 2e-3


def test_a_threads_sixteen_columns_are_sixteen_contiguous_bytes():
    """Position j = 8 g + i of a block holds column k: lane % 4 (k's bits 1, 2) picks 16 contiguous
    positions, and within them the register bits (k0, k3, k4, k5) vary."""
    k = _column_of_position()
    assert sorted(k.tolist()) == list(range(64))
    for lane in range(4):
        cols = k[16 * lane:16 * lane + 16]
        assert {(c >> 1) & 3 for c in cols.tolist()} == {lane}  # and a block has 16 such columns: these


def test_decode_words_by_hand():
    """One group: weights 0-7 with signs alternating and codes 0..7, mantissas 1..8."""
    base = 110
    w = torch.tensor([[(-1) ** i * 2.0 ** (base + i - 127) * (1 + (i + 1) / 128) for i in range(8)] * 8],
                     dtype=torch.bfloat16)
    b_plane, n_plane, got_base, below = pack(w)
    assert got_base == 110 and not below.any()  # the highest even base whose window holds 110..117
    assert torch.equal(unpack(b_plane, n_plane, got_base), w)
    bits = decode_words(torch.tensor([0x04030201]), torch.tensor([0x08070605]), torch.tensor([0]), 2)
    assert bits.tolist() == [[(1 << 8) | b for b in range(1, 9)]]  # code 0, base 2: exponent field 2


def test_pack_names_what_it_takes():
    with pytest.raises(ValueError, match="bf16 \\[N, K\\] weight with K a multiple of 64"):
        pack(torch.zeros(4, 96, dtype=torch.bfloat16))


@pytest.mark.parametrize("mode, block_k, warps", [(1, 128, 8), (1, 64, 4), (2, 128, 8), (0, 128, 8)])
def test_compiles_for_sm90_and_the_rebuild_moves_no_data(mode, block_k, warps):
    """On any machine: the rebuild's reshapes and permutes relabel registers (convert_layout with
    assert_trivial raises otherwise), and mode 1's only shared-memory loads are the planes' 16- and
    8-byte vectors and the epilogue's."""
    pytest.importorskip("triton.experimental.gluon", reason="the probe is written in Gluon")
    from benchmarks.exponent_code_wgmma import compile_for_sm90
    ptx = compile_for_sm90(mode, block_k, stages=2, num_warps=warps).asm["ptx"]
    assert "wgmma.mma_async" in ptx
    if mode == 1:
        assert ptx.count("prmt.b32") >= 4 and "ld.shared.b16" not in ptx and "ld.shared.u8" not in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [dict(BLOCK_K=128, SPLIT_K=1, STAGES=2, num_warps=8),
                                 dict(BLOCK_K=64, SPLIT_K=2, STAGES=3, num_warps=4)])
def test_the_kernel_multiplies_by_the_weight_it_rebuilds(device, cfg):
    if device != "cuda" or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the probe is Gluon for Hopper (TMA, wgmma with a register operand); Triton's interpreter "
                    "does not run Gluon, and the form's CPU tests are above")
    from benchmarks.exponent_code_wgmma import probe
    w = _weight(384, 1024, device)
    x = torch.randn(5, 1024, device=device).to(torch.bfloat16)
    b_plane, n_plane, base, _ = pack(w)
    rebuilt = unpack(b_plane, n_plane, base)
    planes = (b_plane, n_plane, base)
    for got, weight in ((probe(x, planes, cfg), rebuilt), (probe(x, planes, cfg, swizzle=False), rebuilt),
                        (probe(x, w, cfg), w), (probe(x, w, cfg, mode=2), w)):
        ref = x.float() @ weight.float().T
        assert got.shape == ref.shape
        assert (got - ref).abs().max().item() <= 1e-3 * ref.abs().max().item()
