"""GEMM tables written on the spot for GPU tests (`from gemm_tables import gemm_table`; tests/ is
on the path through its conftest)."""

from __future__ import annotations

from pathlib import Path

import torch


def gemm_table(model_dir, path: str | Path, dtype: torch.dtype, choice: dict,
               overrides: dict[str, dict] | None = None) -> str:
    """A `tune-gemm` table of this GPU that sends every linear of the model, at up to 64 rows, to
    `choice`, but those named in `overrides` (and any other of the same shape) to theirs."""
    from shardline.gemm_tuning import GemmTable, key, linear_shapes
    from shardline.manifest import Manifest
    shapes = linear_shapes(Manifest.read(model_dir).model)
    entries = {key(n, k, dtype, dtype): {64: choice} for n, k in shapes.values()}
    for name, other in (overrides or {}).items():
        entries[key(*shapes[name], dtype, dtype)] = {64: other}
    GemmTable(torch.cuda.get_device_name(), entries).save(path)
    return str(path)
