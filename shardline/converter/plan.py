"""A shard plan: every output tensor as a recipe over slices of checkpoint tensors.

The plan is pure data built from the config alone (families.py), so it can be checked against
the checkpoint's metadata and its shapes written into the safetensors header before a single
weight is read. `materialize` then builds one output tensor at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardline.config import ConfigError
from shardline.converter.checkpoint import HFCheckpoint, Span


@dataclass(frozen=True)
class Piece:
    """A slice of one checkpoint tensor, seen as `[out, in]` (GPT-2's Conv1D `[in, out]` transposed).

    `shape` is the full tensor's expected `[out, in]` (or `[n]`) shape, checked against the
    checkpoint before conversion starts.
    """

    source: str
    shape: tuple[int, ...]
    rows: Span | None = None
    cols: Span | None = None
    conv1d: bool = False  # stored as [in, out]
    row_order: tuple[int, ...] | None = None  # permutation of the sliced rows (GPT-J rotary)
    pad_rows: int = 0  # zero rows appended (vocab padding)
    scalar: bool = False  # one value (a per-tensor scale), stored as shape [] or [1]; written as [1]

    @property
    def out_shape(self) -> tuple[int, ...]:
        if self.scalar:
            return (1,)
        n = self.rows[1] - self.rows[0] if self.rows else self.shape[0]
        if len(self.shape) == 1:
            return (n + self.pad_rows,)
        return (n + self.pad_rows, self.cols[1] - self.cols[0] if self.cols else self.shape[1])


@dataclass(frozen=True)
class OutTensor:
    """One tensor of a shard: its pieces concatenated along dim 0."""

    name: str
    pieces: tuple[Piece, ...]
    dtype: torch.dtype | None = None  # None: the conversion's --dtype

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.pieces[0].out_shape
        return (sum(p.out_shape[0] for p in self.pieces), *first[1:])

    @property
    def is_projection(self) -> bool:
        """The weights that int8 weight-only quantization applies to."""
        return self.name.endswith("_proj.weight")


def whole(source: str, shape: tuple[int, ...], conv1d: bool = False) -> Piece:
    return Piece(source, shape, conv1d=conv1d)


def rows(source: str, shape: tuple[int, ...], start: int, stop: int, conv1d: bool = False) -> Piece:
    return Piece(source, shape, rows=(start, stop), conv1d=conv1d)


def cols(source: str, shape: tuple[int, ...], start: int, stop: int, conv1d: bool = False) -> Piece:
    return Piece(source, shape, cols=(start, stop), conv1d=conv1d)


def check_sources(plan: list[OutTensor], ckpt: HFCheckpoint) -> None:
    """Every piece's source exists with the shape the config implies; raises ConfigError."""
    seen: set[str] = set()
    for out in plan:
        for p in out.pieces:
            if p.source in seen:
                continue
            seen.add(p.source)
            if not ckpt.has(p.source):
                raise ConfigError(f"checkpoint {ckpt.dir} has no tensor {p.source!r} (needed for {out.name})")
            stored = ckpt.shape(p.source)
            if p.scalar:  # HFCheckpoint.value checks it holds one value, wherever its shape puts it
                continue
            oriented = stored[::-1] if p.conv1d else stored
            if oriented != p.shape:
                raise ConfigError(f"checkpoint tensor {p.source!r} has shape {list(stored)}, but config.json "
                                  f"implies {list(p.shape[::-1] if p.conv1d else p.shape)}")


def load_piece(ckpt: HFCheckpoint, p: Piece) -> torch.Tensor:
    if p.scalar:
        return torch.tensor([ckpt.value(p.source)], dtype=torch.float32)
    if p.conv1d and len(p.shape) == 2:
        t = ckpt.load(p.source, p.cols, p.rows).t()
    else:
        t = ckpt.load(p.source, p.rows, p.cols)
    if p.row_order is not None:
        t = t[list(p.row_order)]
    if p.pad_rows:
        t = torch.cat([t, t.new_zeros((p.pad_rows, *t.shape[1:]))])
    return t


def materialize(ckpt: HFCheckpoint, out: OutTensor, dtype: torch.dtype) -> torch.Tensor:
    if len(out.pieces) == 1:
        t = load_piece(ckpt, out.pieces[0])
    else:
        t = torch.cat([load_piece(ckpt, p) for p in out.pieces])
    return t.to(dtype).contiguous()
