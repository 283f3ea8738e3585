"""The 12-bit exponent-coded weight form ("exp12"): bf16 weights in 0.75 of their bytes, exactly.

Decode at 64 rows reads every weight byte once a step, so fewer bytes are a faster step. bf16
weights of a trained or randomly drawn matrix use few of their 256 exponents: the top 16 hold all
but ~1e-4 of them. So a weight whose exponent E lies in the matrix's window [base, base + 15]
(base even, the window reaching the top exponent) is stored as its sign, its 7 mantissa bits and
the 4-bit code c = E - base:

- a byte of the B plane [R, K] uint8: c's lowest bit, then the 7 mantissa bits;
- half a byte of the N plane [R, K / 2] uint8: the sign and c's upper 3 bits.

Each 64-column block is stored permuted, so that a thread's share of the wgmma's register
operand is 16 contiguous bytes of the B plane and 8 of the N plane a row, and 8 weights come
back from two B words and one N word in 9 instructions (gluon_exp12.py; `decode_words` emulates
them here). The window is the one that leaves out the fewest weights (`window_base`). Weights
outside it (zeros, the tiniest magnitudes, a stray outlier above the bulk) are stored as the
window's floor, 2^(base - 127), and **corrected exactly**: each tile of 128 stored rows lists
those weights (row in the tile, column, true value; sorted by column, so that each K split of a
tile takes its own columns' run of the list, at most 64), and the kernel adds, after its loop,
the product of x's columns with (true value - floor), as two bf16 terms (the value, and -floor),
so the weights multiplied are the bf16 weights themselves, bit for bit (`Exp12Weight.weight`).

Rows are stored in the order the kernel's tiles take them: with `glu` (the fused [gate; up]
projection, [2N, K]) each 16-row slab of a tile is 8 gate rows then the 8 up rows N below them,
so that a thread's accumulator holds gate and up of the same output; else in their own order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

TILE_ROWS = 128  # stored rows a program multiplies (8 warps, 16 rows each)
BLOCK = 64  # the columns a permuted block spans (the wgmma's K of 16, four lanes' worth)
MAX_ENTRIES = 64  # out-of-window weights one tile's K split may list (its correction: [128, 2 * 64] x [2 * 64, 64])
MASK = 0x87878787  # a byte's sign bit and its 3 bits of c >> 1


def column_of_position() -> torch.Tensor:
    """[64] int64: the column k that stored position j of a 64-column block holds; position
    j = 8 g + i holds the k with bits (k0, k3, k4) = i's and (k5, k1, k2) = g's."""
    j = torch.arange(BLOCK)
    i0, i1, i2 = j & 1, (j >> 1) & 1, (j >> 2) & 1
    g0, g1, g2 = (j >> 3) & 1, (j >> 4) & 1, (j >> 5) & 1
    return i0 + 2 * g1 + 4 * g2 + 8 * i1 + 16 * i2 + 32 * g0


def _column_order(k: int, device) -> torch.Tensor:
    return (torch.arange(k // BLOCK)[:, None] * BLOCK + column_of_position()[None, :]).reshape(-1).to(device)


def row_order(rows: int, glu: bool) -> torch.Tensor:
    """[rows] int64: the weight row that stored row p holds. With `glu`, stored row
    p = 128 t + 16 s + 8 h + i holds gate row 64 t + 8 s + i (h = 0) or the up row N below it."""
    if not glu:
        return torch.arange(rows)
    n = rows // 2
    p = torch.arange(rows)
    t, s, h, i = p // 128, (p // 16) % 8, (p // 8) % 2, p % 8
    return h * n + 64 * t + 8 * s + i


def check_shape(rows: int, k: int, glu: bool) -> str | None:
    """Why a [rows, K] weight cannot take the form (None when it can)."""
    if k % BLOCK:
        return f"K={k} is not a multiple of {BLOCK}"
    if glu and rows % (2 * 64):
        return f"the fused [gate; up] weight's {rows // 2} gate rows are not a multiple of 64"
    if not glu and rows % TILE_ROWS:
        return f"{rows} rows are not a multiple of {TILE_ROWS}"
    return None


def window_base(exponent: torch.Tensor) -> int:
    """The even base whose window [base, base + 15] leaves out the fewest of these exponent fields
    (the highest such base): the bulk of a matrix's weights, not its largest outlier's exponent,
    which one stray large weight would push up, leaving the small weights below."""
    hist = torch.bincount(exponent.reshape(-1), minlength=256).cpu().tolist()
    inside = [sum(hist[b:b + 16]) for b in range(0, 241, 2)]
    best = max(inside)
    return 2 * max(i for i, n in enumerate(inside) if n == best)


def planes(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(B plane [R, K] uint8, N plane [R, K / 2] uint8, base, below [R, K] bool) of a bf16 [R, K]
    weight in stored row order (K a multiple of 64); `below`: the weights outside the window (under
    it, or over it where a few outliers lie above the bulk), stored as its floor."""
    r, k = w.shape
    if w.dtype != torch.bfloat16 or k % BLOCK:
        raise ValueError(f"the 12-bit form takes a bf16 [N, K] weight with K a multiple of {BLOCK}; "
                         f"got {w.dtype} {tuple(w.shape)}")
    bits = w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    sign, exponent, mantissa = bits >> 15, (bits >> 7) & 0xFF, bits & 0x7F
    if w.numel() and int(exponent.max()) == 0xFF:
        raise ValueError("the weight holds inf or NaN, which the 12-bit form cannot store; fix the checkpoint")
    base = window_base(exponent)
    code = exponent - base
    below = (code < 0) | (code > 15)  # outside the window: stored as its floor, listed with their true values
    zero = torch.zeros_like(code)
    sign, code, mantissa = (torch.where(below, zero, t) for t in (sign, code, mantissa))
    order = _column_order(k, w.device)
    sign, code, mantissa = sign[:, order], code[:, order], mantissa[:, order]
    b_plane = (((code & 1) << 7) | mantissa).to(torch.uint8)
    s, h = sign.view(r, k // 8, 8), (code >> 1).view(r, k // 8, 8)
    n_bytes = [(s[..., b] << 7) | h[..., b] | (h[..., b + 4] << 4) | (s[..., 4 + (b + 3) % 4] << 3) for b in range(4)]
    n_plane = torch.stack(n_bytes, dim=-1).to(torch.uint8).reshape(r, k // 2)
    return b_plane, n_plane, base, below


def decode_words(b_lo: torch.Tensor, b_hi: torch.Tensor, n_word: torch.Tensor, base: int) -> torch.Tensor:
    """The kernel's decode on int64 tensors holding 32-bit words: [..., 8] bf16 bit patterns
    (int64) of a group's weights 0-7. The N word masked gives weights 0-3 their high bytes
    [sign, 0000, c >> 1], rotated right by 4 and masked weights 4-7's; one add puts base / 2 in
    every byte's exponent bits; byte permutes pair each high byte with its B byte."""
    add = (base // 2) * 0x01010101
    hi = (n_word & MASK) + add
    rot = ((n_word >> 4) | (n_word << 28)) & 0xFFFFFFFF
    hi_b = (rot & MASK) + add

    def byte(word, b):
        return (word >> (8 * b)) & 0xFF

    out = []
    for word, high in ((b_lo, hi), (b_hi, hi_b)):
        for b in range(4):
            out.append((byte(high, b) << 8) | byte(word, b))
    return torch.stack(out, dim=-1)


def unpack(b_plane: torch.Tensor, n_plane: torch.Tensor, base: int) -> torch.Tensor:
    """The bf16 [R, K] weight the kernel's loop multiplies (below-window weights as the floor), by
    decode_words, in column order."""
    r, k = b_plane.shape
    b = b_plane.contiguous().view(torch.int32).to(torch.int64).view(r, k // 8, 2) & 0xFFFFFFFF
    nw = n_plane.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    stored = decode_words(b[..., 0], b[..., 1], nw, base).reshape(r, k)
    bits = torch.empty_like(stored)
    bits[:, _column_order(k, b_plane.device)] = stored
    return bits.to(torch.int32).to(torch.int16).view(torch.bfloat16)


@dataclass
class Exp12Weight:
    """A bf16 [rows, K] weight in the 12-bit form, rows in stored order (`row_order`), with each
    tile's corrections sorted by column: `corr_rows` [tiles, entries] int32 (the row in the tile,
    -1 for none), `corr_cols` int32 (the column), `corr_vals` bf16 (the true weight), and
    `corr_start` [tiles, K / 64 + 1] int32 (where the entries of each 64-column block begin, so
    that a K split takes its own columns' entries). `block_counts` [tiles, K / 64]: the entries of
    each block, on the host, for checking a config against the list without a device sync."""

    b_plane: torch.Tensor
    n_plane: torch.Tensor
    base: int
    glu: bool
    corr_rows: torch.Tensor
    corr_cols: torch.Tensor
    corr_vals: torch.Tensor
    corr_start: torch.Tensor
    block_counts: torch.Tensor
    _split_entries: dict = field(default_factory=dict, repr=False)  # (BLOCK_K, SPLIT_K) -> the most a split holds

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.b_plane.shape)

    @property
    def entries(self) -> int:
        return self.corr_rows.shape[1]

    @property
    def floor(self) -> float:
        """The value every below-window weight is stored as: 2^(base - 127)."""
        return 2.0 ** (self.base - 127)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.b_plane, self.n_plane, self.corr_rows, self.corr_cols,
                                                           self.corr_vals, self.corr_start))

    def unfit(self, config: dict | None) -> str | None:
        """Why the kernel cannot run this weight with a table entry's config, or None: a K split
        without a K tile, or one whose columns hold more corrections than its list (MAX_ENTRIES)."""
        cfg = exp12_config(config)
        block_k, split_k = cfg["BLOCK_K"], cfg["SPLIT_K"]
        if (why := split_fits(self.shape[1], block_k, split_k)) is not None:
            return why
        if (most := self._most_a_split(block_k, split_k)) <= MAX_ENTRIES:
            return None
        finer = [s for s in range(split_k + 1, MAX_SPLIT_K + 1) if split_fits(self.shape[1], block_k, s) is None
                 and self._most_a_split(block_k, s) <= MAX_ENTRIES]
        fix = f"split K more ways (SPLIT_K {', '.join(map(str, finer))} fit)" if finer else \
            f"no finer split of BLOCK_K={block_k} holds them"
        return (f"the 12-bit form: {most} weights outside the exponent window [{self.base}, {self.base + 15}] fall "
                f"in one tile's K split of SPLIT_K={split_k} (a split corrects at most {MAX_ENTRIES}): {fix}, "
                "or keep the weight in bf16")

    def split_entries(self, block_k: int, split_k: int) -> int:
        """The correction list the kernel holds for one (tile, K split) of this config: the most
        entries any split's columns hold, rounded up to a power of two (16 at least); a
        ValueError where the config does not fit (`unfit`)."""
        if (why := self.unfit({"BLOCK_K": block_k, "SPLIT_K": split_k})) is not None:
            raise ValueError(why)
        return max(16, 1 << max(self._most_a_split(block_k, split_k) - 1, 0).bit_length())

    def _most_a_split(self, block_k: int, split_k: int) -> int:
        if (block_k, split_k) not in self._split_entries:
            tiles, blocks = self.block_counts.shape
            per = split_tiles(blocks * BLOCK, block_k, split_k)[1] * block_k // BLOCK  # a split's 64-column blocks
            counts = torch.nn.functional.pad(self.block_counts, (0, per * split_k - blocks))
            self._split_entries[block_k, split_k] = int(counts.view(tiles, split_k, per).sum(-1).max()) if tiles else 0
        return self._split_entries[block_k, split_k]

    def weight(self) -> torch.Tensor:
        """The bf16 weight in its own row order: the planes' values with the corrections applied,
        which is the weight packed, bit for bit."""
        stored = unpack(self.b_plane, self.n_plane, self.base)
        t, e = torch.nonzero(self.corr_rows >= 0, as_tuple=True)
        stored[t * TILE_ROWS + self.corr_rows[t, e].long(), self.corr_cols[t, e].long()] = self.corr_vals[t, e]
        out = torch.empty_like(stored)
        out[row_order(stored.shape[0], self.glu).to(stored.device)] = stored
        return out


def pack(w: torch.Tensor, glu: bool = False) -> Exp12Weight:
    """The 12-bit form of a bf16 [rows, K] weight (the fused [gate; up] projection with `glu`), or
    a ValueError that names what it cannot take: a shape the tiles do not divide, or more
    below-window weights in one tile than even its finest K split corrects (the weight then stays
    bf16). Whether a config's K split corrects its share: `Exp12Weight.unfit`."""
    rows, k = w.shape
    if (why := check_shape(rows, k, glu)) is not None:
        raise ValueError(f"the 12-bit form cannot take a {rows}x{k} weight: {why}; keep it in bf16")
    stored = w[row_order(rows, glu).to(w.device)]
    b_plane, n_plane, base, below = planes(stored)
    tiles, blocks = rows // TILE_ROWS, k // BLOCK
    counts = below.view(tiles, TILE_ROWS, blocks, BLOCK).sum((1, 3), dtype=torch.int32)  # [tiles, blocks]
    per_tile = counts.sum(1)
    most = int(per_tile.max()) if tiles else 0
    if most > MAX_ENTRIES * MAX_SPLIT_K:
        raise ValueError(f"the 12-bit form: {most} weights of one {TILE_ROWS}-row tile lie outside the exponent window "
                         f"[{base}, {base + 15}] (at most {MAX_ENTRIES} a K split, {MAX_SPLIT_K} splits); the weight's "
                         "exponents spread too widely, keep it in bf16")
    # each tile's entries sorted by column (then row): a K split's entries are one run of its tile's list
    t_idx, col, p_in = torch.nonzero(below.view(tiles, TILE_ROWS, k).transpose(1, 2), as_tuple=True)
    entries = max(16, 1 << max(most - 1, 0).bit_length())
    first = torch.cumsum(per_tile, 0) - per_tile
    slot = torch.arange(col.numel(), device=w.device) - first[t_idx]
    corr_rows = torch.full((tiles, entries), -1, dtype=torch.int32, device=w.device)
    corr_cols = torch.zeros((tiles, entries), dtype=torch.int32, device=w.device)
    corr_vals = torch.zeros((tiles, entries), dtype=torch.bfloat16, device=w.device)
    corr_rows[t_idx, slot] = p_in.to(torch.int32)
    corr_cols[t_idx, slot] = col.to(torch.int32)
    corr_vals[t_idx, slot] = stored[t_idx * TILE_ROWS + p_in, col]
    corr_start = torch.nn.functional.pad(torch.cumsum(counts, 1, dtype=torch.int32), (1, 0))
    return Exp12Weight(b_plane, n_plane, base, glu, corr_rows, corr_cols, corr_vals, corr_start.contiguous(),
                       counts.cpu())


# What a tune-gemm table's exp12 entry may hold (gluon_exp12.py's tile: 128 stored rows, 8 warps).
EXP12_DEFAULT_CONFIG = dict(BLOCK_K=128, STAGES=4, SPLIT_K=1)
EXP12_KEYS = ("BLOCK_K", "STAGES", "SPLIT_K", "EARLY", "LATE")
EXP12_TILES = [dict(BLOCK_K=128, STAGES=4), dict(BLOCK_K=128, STAGES=3), dict(BLOCK_K=64, STAGES=8),
               dict(BLOCK_K=64, STAGES=6)]  # what `tune-gemm --in-step` tries for a SwiGLU up-projection
MAX_SPLIT_K = 8


def exp12_tiles(rows: int, sms: int) -> list[dict]:
    """The tiles `tune-gemm --in-step` tries for a product of `rows` stored rows on `sms`
    multiprocessors: EXP12_TILES, and where the tiles leave most multiprocessors idle (o and
    down: 32 tiles) their twins with K split until the splits fill about one wave."""
    tiles = max(rows // TILE_ROWS, 1)
    splits = [s for s in (2, 4, 8) if tiles * s <= 1.25 * sms and tiles * s >= 0.5 * sms]
    if tiles >= 0.75 * sms or not splits:
        return [dict(c) for c in EXP12_TILES]
    return [dict(c, SPLIT_K=s) for s in splits for c in EXP12_TILES]


def split_tiles(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(K's tiles of `block_k` columns, the tiles a split takes): K split as the kernel splits it,
    split s taking tiles [s * per, (s + 1) * per), the last one what is left."""
    k_tiles = -(-k // block_k)
    return k_tiles, -(-k_tiles // split_k)


def split_fits(k: int, block_k: int, split_k: int) -> str | None:
    """Why K split `split_k` ways in whole `block_k` tiles leaves a split without one, or None."""
    k_tiles, per = split_tiles(k, block_k, split_k)
    if (split_k - 1) * per >= k_tiles:
        return (f"exp12 SPLIT_K={split_k}: K={k} is {k_tiles} tiles of {block_k} columns, too few for every split "
                "to take one; choose a SPLIT_K that divides them")
    return None


def exp12_config(config: dict | None) -> dict:
    """EXP12_DEFAULT_CONFIG updated with `config`, or a ValueError naming the key or value the
    kernel cannot take."""
    unknown = set(config or {}) - set(EXP12_KEYS)
    if unknown:
        raise ValueError(f"exp12 config keys {sorted(unknown)} unknown; it takes {', '.join(EXP12_KEYS)}")
    cfg = dict(EXP12_DEFAULT_CONFIG, **(config or {}))
    if cfg["BLOCK_K"] not in (64, 128):
        raise ValueError(f"exp12 BLOCK_K={cfg['BLOCK_K']!r}: one of 64, 128")
    if not (isinstance(cfg["STAGES"], int) and 2 <= cfg["STAGES"] <= (8 if cfg["BLOCK_K"] == 64 else 4)):
        raise ValueError(f"exp12 STAGES={cfg['STAGES']!r}: 2 to 4 stages of 128 columns (8 of 64) fit beside "
                         "the correction's buffers")
    if not (isinstance(cfg["SPLIT_K"], int) and 1 <= cfg["SPLIT_K"] <= MAX_SPLIT_K):
        raise ValueError(f"exp12 SPLIT_K={cfg['SPLIT_K']!r}: an integer from 1 to {MAX_SPLIT_K}")
    if not (isinstance(cfg.get("EARLY", 0), int) and cfg.get("EARLY", 0) >= 0) or cfg.get("LATE", 0) not in (0, 1):
        raise ValueError(f"exp12 EARLY={cfg.get('EARLY')!r}, LATE={cfg.get('LATE')!r}: EARLY an integer >= 0 (stages "
                         "requested before the PDL wait; default all), LATE 0 or 1")
    return cfg
