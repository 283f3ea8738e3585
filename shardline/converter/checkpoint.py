"""Read-only access to a HuggingFace checkpoint's tensors, one slice at a time.

Shapes come from file metadata without reading data; `load` reads only the requested rows or
columns (safetensors slices, or mmap-ed views of a torch `.bin`), so converting never holds more
than the slices one output tensor needs.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from shardline.config import ConfigError

Span = tuple[int, int]  # [start, stop)

# Saved checkpoints disagree on the wrapper-module prefix (`transformer.h.0...` vs `h.0...`).
_PREFIXES = ("model.", "transformer.")


def _weight_files(hf_dir: Path) -> list[Path]:
    for index_name, single in (("model.safetensors.index.json", "model.safetensors"),
                               ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        index = hf_dir / index_name
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            return [hf_dir / name for name in sorted(set(weight_map.values()))]
        if (hf_dir / single).is_file():
            return [hf_dir / single]
    found = sorted(hf_dir.glob("*.safetensors")) or sorted(hf_dir.glob("*.bin"))
    if not found:
        raise ConfigError(f"no weights in {hf_dir}: expected *.safetensors (optionally with "
                          f"model.safetensors.index.json) or pytorch_model.bin")
    return found


class HFCheckpoint:
    """The tensors of one checkpoint directory; use as a context manager to close the files."""

    def __init__(self, hf_dir: str | Path):
        self.dir = Path(hf_dir)
        self.files = _weight_files(self.dir)
        self._stack = ExitStack()
        self._safetensors: dict[str, object] = {}  # name -> open safe_open handle
        self._torch: dict[str, torch.Tensor] = {}  # name -> mmap-ed tensor
        try:
            for path in self.files:
                if path.suffix == ".safetensors":
                    handle = self._stack.enter_context(safe_open(str(path), framework="pt"))
                    self._safetensors.update((name, handle) for name in handle.keys())
                else:
                    self._torch.update(torch.load(path, weights_only=True, mmap=True, map_location="cpu"))
        except Exception as e:
            self._stack.close()
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"cannot read weights {path}: {e}") from e

    def __enter__(self) -> "HFCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._torch.clear()
        self._safetensors.clear()
        self._stack.close()

    def names(self) -> list[str]:
        return sorted([*self._safetensors, *self._torch])

    def resolve(self, name: str) -> str | None:
        """The stored name for `name`, tolerating a missing or extra wrapper prefix."""
        candidates = [name]
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                candidates.append(name[len(prefix):])
        candidates += [prefix + name for prefix in _PREFIXES]
        for c in candidates:
            if c in self._safetensors or c in self._torch:
                return c
        return None

    def has(self, name: str) -> bool:
        return self.resolve(name) is not None

    def _stored(self, name: str) -> str:
        stored = self.resolve(name)
        if stored is None:
            raise ConfigError(f"checkpoint {self.dir} has no tensor {name!r}")
        return stored

    def shape(self, name: str) -> tuple[int, ...]:
        stored = self._stored(name)
        if stored in self._torch:
            return tuple(self._torch[stored].shape)
        return tuple(self._safetensors[stored].get_slice(stored).get_shape())

    def value(self, name: str) -> float:
        """The one value of tensor `name` (a per-tensor scale, stored as shape [] or [1])."""
        stored = self._stored(name)
        t = self._torch[stored] if stored in self._torch else self._safetensors[stored].get_tensor(stored)
        if t.numel() != 1:
            raise ConfigError(f"checkpoint tensor {name!r} has shape {list(t.shape)}; a per-tensor scale has one value")
        return float(t.reshape(-1)[0].float())

    def load(self, name: str, rows: Span | None = None, cols: Span | None = None) -> torch.Tensor:
        """Rows `[rows)` and columns `[cols)` of tensor `name` (all when None), as a new tensor."""
        stored = self._stored(name)
        index: tuple[slice, ...] = (slice(*rows) if rows else slice(None),)
        if cols:
            index += (slice(*cols),)
        if stored in self._torch:
            return self._torch[stored][index].clone()  # copy out of the mmap: only this slice
        return self._safetensors[stored].get_slice(stored)[index]
