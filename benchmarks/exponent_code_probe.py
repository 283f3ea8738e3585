"""Could batch-64 decode read fewer bytes of the same bf16 weights? A probe, not an engine path.

    python -m benchmarks.exponent_code_probe [--shapes gate/up,down] [--quick]

The batch-64 step streams 15 GB of bf16 weights a step and is bound by that stream (docs/benchmarks.md:
its products run at 3.8 TB/s, the copy rate is 4.26). A bf16 weight is a sign, 8 exponent bits and
7 mantissa bits, and a layer's exponents take few values: random weights of std 0.02 (the
benchmarks') use 28 exponents, with 2.55 bits of entropy, and the top 15 hold 99.985% of them (a
trained checkpoint's would need measuring). So a weight can be stored, losslessly, as

- one byte: its sign and its 7 mantissa bits, and
- a 4-bit code: its exponent minus the tensor's base (the largest exponent - 14), 15 meaning "not
  in the window" (zeros and the tiniest magnitudes, 0.015% at std 0.02), which a real path adds
  back as a sparse correction (here they decode as 0, and the check compares with that),

12 bits instead of 16: 0.75 of the bytes. Codes are stored two to a byte, code k0 + j beside code
k0 + BLOCK_K / 2 + j of each BLOCK_K block, so that a tile decodes as two halves without a shuffle.

This times, at 64 rows, plain Triton kernels (tiles by pointer loads or, with TMA=1 in the tile,
through tensor descriptors; the weight the MMA's A operand or, with X_AS_A=1, its B) in forms
with the same tiles and loop: reading the bf16 weight as it is, and reading the 12-bit form and
rebuilding bf16 in registers before the product. A third form reads bf16's own two bytes as two
byte planes and joins them in registers: the 12-bit form's uint8 loads and conversions into the
MMA's operand, with little of its arithmetic, to tell the two costs apart. Beside them, cuBLAS
and the split-K kernel at the H200 table's tile. The question for an engine path: does the
12-bit form's time fall toward 0.75 of the bf16 form's, or does rebuilding cost what the bytes
save? (On an H200, session k: it cost 2.0-2.7x the bf16 form's time; docs/benchmarks.md.)
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

ESCAPE = 15  # the code of an exponent outside the window
_ESCAPE = tl.constexpr(ESCAPE)


def pack_e4(w: torch.Tensor, block_k: int) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(mantissa bytes [N, K] uint8, codes [N, K / 2] uint8, base, escaped [N, K] bool) of a bf16
    [N, K] weight: byte = sign << 7 | mantissa; code = exponent - base in 0..14, else ESCAPE. In
    each block of block_k columns, codes byte j holds column j's code in its low nibble and column
    j + block_k / 2's in its high one."""
    n, k = w.shape
    if w.dtype != torch.bfloat16 or k % block_k or block_k % 2:
        raise ValueError(f"pack_e4 takes a bf16 [N, K] weight with K a multiple of block_k (even); got "
                         f"{w.dtype} {tuple(w.shape)}, block_k {block_k}")
    bits = w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    exponent = (bits >> 7) & 0xFF
    base = max(int(exponent.max()) - (ESCAPE - 1), 1)
    code = exponent - base
    escaped = (code < 0) | (code >= ESCAPE)
    code = torch.where(escaped, torch.full_like(code, ESCAPE), code)
    mant = (((bits >> 8) & 0x80) | (bits & 0x7F)).to(torch.uint8)
    half = block_k // 2
    blocks = code.view(n, k // block_k, 2, half)
    codes = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).to(torch.uint8).reshape(n, k // 2)
    return mant, codes, base, escaped


def unpack_e4(mant: torch.Tensor, codes: torch.Tensor, base: int, block_k: int) -> torch.Tensor:
    """The bf16 weight pack_e4 stored, escaped entries as 0 (what the kernel multiplies)."""
    n, k = mant.shape
    half = block_k // 2
    c = codes.to(torch.int32).view(n, k // block_k, half)
    code = torch.stack([c & 0xF, c >> 4], dim=2).reshape(n, k)
    m = mant.to(torch.int32)
    bits = ((m & 0x80) << 8) | ((code + base) << 7) | (m & 0x7F)
    bits = torch.where(code == ESCAPE, torch.zeros_like(bits), bits)
    return bits.to(torch.int16).view(torch.bfloat16)


@triton.jit
def _weight_half(MODE: tl.constexpr, first, second, base, HIGH: tl.constexpr):
    """Half a BLOCK_K step's weight tile in bf16, from what the form stores: MODE 0, the tile itself
    (`first`; `second` unused); 1, pack_e4's sign-and-mantissa bytes (`first`) and the codes
    (`second`, this half's nibble: the high one when HIGH), ESCAPE rebuilt as 0; 2, the low and the
    high byte planes. MODE 0 returns from an else of its own: the compiler generates what follows a
    constexpr branch's return too, and would find two return types where `first` is fp16."""
    if MODE == 0:
        return first
    else:
        m = first.to(tl.int32)
        if MODE == 1:
            c = (second.to(tl.int32) >> 4) if HIGH else (second.to(tl.int32) & 0xF)
            bits = ((m & 0x80) << 8) | ((c + base) << 7) | (m & 0x7F)
            bits = tl.where(c == _ESCAPE, 0, bits)
        else:
            bits = m | (second.to(tl.int32) << 8)
        return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _probe_kernel(x_ptr, w_ptr, second_ptr, part_ptr, M, N, K, k_per_split, base,
                  MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """part[pid_k, :M, tile] = x[:, split's K] @ w[tile, split's K].T, the weight read as bf16
    (MODE 0: w_ptr the weight), as pack_e4's bytes and codes rebuilt in registers (1: w_ptr the
    bytes, second_ptr the codes), or as its two byte planes put together in registers (2: w_ptr the
    low plane, second_ptr the high; bf16's 2 bytes a weight, loaded and converted as the 12-bit
    form's are, with little of its arithmetic). Each BLOCK_K step is two products of BLOCK_K / 2
    columns (the codes' halves), the weight tile as the MMA's A operand."""
    HALF: tl.constexpr = BLOCK_K // 2
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    xm = tl.arange(0, BLOCK_M)
    j = tl.arange(0, HALF)
    x_mask = xm[:, None] < M
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    k_lo = pid_k * k_per_split
    for k0 in range(k_lo, k_lo + k_per_split, BLOCK_K):
        x_lo = tl.load(x_ptr + xm[:, None] * K + (k0 + j)[None, :], mask=x_mask, other=0.0)
        x_hi = tl.load(x_ptr + xm[:, None] * K + (k0 + HALF + j)[None, :], mask=x_mask, other=0.0)
        lo = rows[:, None] * K + (k0 + j)[None, :]  # the offsets of this step's first half in [N, K]
        second_lo, second_hi = x_lo, x_lo  # MODE 0 reads nothing more (_weight_half leaves these)
        if MODE == 1:  # one codes tile serves both halves
            second_lo = tl.load(second_ptr + rows[:, None] * (K // 2) + (k0 // 2 + j)[None, :])
            second_hi = second_lo
        elif MODE == 2:
            second_lo = tl.load(second_ptr + lo)
            second_hi = tl.load(second_ptr + lo + HALF)
        w_lo = _weight_half(MODE, tl.load(w_ptr + lo), second_lo, base, False)
        w_hi = _weight_half(MODE, tl.load(w_ptr + lo + HALF), second_hi, base, True)
        acc = tl.dot(w_lo, tl.trans(x_lo), acc)
        acc = tl.dot(w_hi, tl.trans(x_hi), acc)
    out = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(part_ptr + pid_k * M * N + xm[:, None] * N + cols[None, :], out, mask=x_mask)


@triton.jit
def _probe_tma_kernel(x_desc, w_desc, second_desc, part_ptr, M, N, k_per_split, base, MODE: tl.constexpr,
                      X_AS_A: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """_probe_kernel with every tile through a tensor descriptor (TMA into shared memory, as the
    table's kernels load), and with X_AS_A the product the other way round, x the MMA's A operand
    and the rebuilt weight its B, as the split-K kernel multiplies."""
    HALF: tl.constexpr = BLOCK_K // 2
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row0 = pid_n * BLOCK_N
    if X_AS_A:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    k_lo = pid_k * k_per_split
    for k0 in range(k_lo, k_lo + k_per_split, BLOCK_K):
        x_lo = x_desc.load([0, k0])
        x_hi = x_desc.load([0, k0 + HALF])
        second_lo, second_hi = x_lo, x_lo  # as in _probe_kernel
        if MODE == 1:
            second_lo = second_desc.load([row0, k0 // 2])
            second_hi = second_lo
        elif MODE == 2:
            second_lo = second_desc.load([row0, k0])
            second_hi = second_desc.load([row0, k0 + HALF])
        w_lo = _weight_half(MODE, w_desc.load([row0, k0]), second_lo, base, False)
        w_hi = _weight_half(MODE, w_desc.load([row0, k0 + HALF]), second_hi, base, True)
        if X_AS_A:
            acc = tl.dot(x_lo, tl.trans(w_lo), acc)
            acc = tl.dot(x_hi, tl.trans(w_hi), acc)
        else:
            acc = tl.dot(w_lo, tl.trans(x_lo), acc)
            acc = tl.dot(w_hi, tl.trans(x_hi), acc)
    out = acc if X_AS_A else tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    xm = tl.arange(0, BLOCK_M)
    cols = row0 + tl.arange(0, BLOCK_N)
    tl.store(part_ptr + pid_k * M * N + xm[:, None] * N + cols[None, :], out, mask=xm[:, None] < M)


def byte_planes(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(low bytes, high bytes) of a bf16 [N, K] weight, each [N, K] uint8."""
    b = w.contiguous().view(torch.uint8).view(*w.shape, 2)
    return b[..., 0].contiguous(), b[..., 1].contiguous()


def probe(x: torch.Tensor, weight, cfg: dict) -> torch.Tensor:
    """x [M <= 64, K] @ W.T in fp32, W given as a bf16 tensor, as pack_e4's (mant, codes, base) or
    as byte_planes' (low, high)."""
    mode = 0 if isinstance(weight, torch.Tensor) else 1 if len(weight) == 3 else 2
    first, second, base = (weight, weight, 0) if mode == 0 else weight if mode == 1 else (*weight, 0)
    n, k = first.shape
    bn, bk, split = cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
    part = torch.empty(split, x.shape[0], n, device=x.device, dtype=torch.float32)
    if cfg.get("TMA"):
        from triton.tools.tensor_descriptor import TensorDescriptor
        half = bk // 2  # a tile: half a block's columns (bf16, bytes, or E4's codes, [N, K / 2])
        x_desc, w_desc, second_desc = (TensorDescriptor.from_tensor(t, [rows, half])
                                       for t, rows in ((x, 64), (first, bn), (second, bn)))
        _probe_tma_kernel[(n // bn, split)](x_desc, w_desc, second_desc, part, x.shape[0], n, k // split,
                                            base, MODE=mode, X_AS_A=bool(cfg.get("X_AS_A")), BLOCK_M=64,
                                            BLOCK_N=bn, BLOCK_K=bk, num_warps=cfg["num_warps"],
                                            num_stages=cfg["num_stages"])
        return part.sum(0) if split > 1 else part[0]
    _probe_kernel[(n // bn, split)](x, first, second, part,  # MODE 0 does not read `second`
                                    x.shape[0], n, k, k // split, base, MODE=mode, BLOCK_M=64, BLOCK_N=bn, BLOCK_K=bk,
                                    num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return part.sum(0) if split > 1 else part[0]


SHAPES = {"gate/up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096)}
TILES = [dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4, TMA=1),
         dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4, TMA=1, X_AS_A=1),
         dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=5, TMA=1),
         dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=5, TMA=1, X_AS_A=1),
         dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4),
         dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=8, num_stages=4),
         dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=5),
         dict(BLOCK_N=64, BLOCK_K=256, SPLIT_K=1, num_warps=4, num_stages=3),
         dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=5),
         dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=2, num_warps=8, num_stages=4)]


def fits(n: int, k: int, cfg: dict) -> bool:
    return n % cfg["BLOCK_N"] == 0 and k % (cfg["BLOCK_K"] * cfg["SPLIT_K"]) == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="gate/up,down", help=f"comma list of {','.join(SHAPES)}")
    ap.add_argument("--quick", action="store_true", help="the first two tiles only")
    args = ap.parse_args()
    names = args.shapes.split(",")
    if unknown := [s for s in names if s not in SHAPES]:
        ap.error(f"--shapes {args.shapes}: unknown {unknown}; use a comma list of {','.join(SHAPES)}")
    if not torch.cuda.is_available():
        raise SystemExit("exponent_code_probe times GPU kernels; it needs a CUDA GPU")
    from shardline.gemm_tuning import _time_graph_us, agrees
    from shardline.kernels import quant

    torch.manual_seed(0)
    rows = []
    for name in names:
        n, k = SHAPES[name]
        w = torch.empty(n, k, device="cuda", dtype=torch.bfloat16).normal_(0.0, 0.02)  # random_weights' std
        copies = max(1, -(-(512 << 20) // (w.numel() * 2)))  # >= 512 MB of weights: L2 holds none of it
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        x = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
        packed, planes = {}, None
        gb = w.numel() * 2 / 1e3  # bf16 bytes / 1e3: GB/s of bf16-equivalent weight from us

        def report(variant, us, ok, cfg=None, **extra):
            rows.append({"shape": name, "variant": variant, "us": round(us, 2), "bf16_GBps": round(gb / us, 1),
                         "tiles": cfg, "agrees": ok, **extra})
            print(json.dumps(rows[-1]), flush=True)

        ref = torch.nn.functional.linear(x, w).float()
        report("cublas", _time_graph_us(lambda i: torch.nn.functional.linear(x, ws[i]), copies), True)
        table = dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=1 if name != "down" else 2, num_warps=4, num_stages=4, TMA=1)
        if fits(n, k, table):
            report("split-K kernel (TMA)", _time_graph_us(lambda i: quant.small_m_linear(x, ws[i], None, None, table),
                                                          copies), agrees(quant.small_m_linear(x, w, None, None, table),
                                                                          ref), table)
        for cfg in TILES[:2] if args.quick else TILES:
            if not fits(n, k, cfg):
                continue
            bk = cfg["BLOCK_K"]
            if bk not in packed:
                packed[bk] = [pack_e4(t, bk)[:3] for t in ws]
                _, _, base, escaped = pack_e4(w, bk)
                flushed = unpack_e4(*packed[bk][0], bk)
                ref_e4 = torch.nn.functional.linear(x, flushed).float()
                frac = escaped.float().mean().item()
            report("probe, bf16", _time_graph_us(lambda i: probe(x, ws[i], cfg), copies),
                   agrees(probe(x, w, cfg), ref), cfg)
            report("probe, 12-bit (E4)", _time_graph_us(lambda i: probe(x, packed[bk][i], cfg), copies),
                   agrees(probe(x, packed[bk][0], cfg), ref_e4), cfg, escaped=round(frac, 6), base=base)
            if planes is None:
                planes = [byte_planes(t) for t in ws]
            report("probe, byte planes", _time_graph_us(lambda i: probe(x, planes[i], cfg), copies),
                   agrees(probe(x, planes[0], cfg), ref), cfg)
        del ws, packed, planes
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}: 64 rows, us a launch (GB/s of the bf16 weight it stands for)")
    best = {}
    for r in rows:
        tiles = "" if r["tiles"] is None else ",".join(f"{a}={b}" for a, b in r["tiles"].items())
        print(f"{r['shape']:<8} {r['variant']:<22} {r['us']:>8.2f} {r['bf16_GBps']:>7.0f}  {tiles}"
              f"{'  WRONG' if r['agrees'] is False else ''}")
        if r["variant"].startswith("probe") and r["agrees"]:
            key = (r["shape"], r["variant"])
            best[key] = min(best.get(key, float("inf")), r["us"])
    for name in names:
        b16, e4, bp = (best.get((name, v)) for v in ("probe, bf16", "probe, 12-bit (E4)", "probe, byte planes"))
        if b16 and e4 and bp:
            print(f"{name}: best bf16 {b16:.2f} us; 12-bit {e4:.2f} ({e4 / b16:.3f}; bytes 0.75); "
                  f"byte planes {bp:.2f} ({bp / b16:.3f}; bytes 1)")


if __name__ == "__main__":
    main()
