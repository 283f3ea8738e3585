"""A streaming safetensors writer: the header is planned up front, tensors arrive one at a time.

The safetensors layout is `u64 little-endian header length | JSON header | raw tensor bytes`,
where the header gives each tensor's dtype, shape and `[begin, end)` byte offsets into the data.
Because every (name, dtype, shape) is known before any data is produced, the header can be
written first and each tensor's bytes appended (and hashed) as it arrives, so the writer holds
at most one tensor at a time, whatever the file's size.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.int32: "I32",
    torch.int64: "I64",
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class WrittenFile:
    sha256: str  # of the whole file, as `shardline.manifest.sha256_file` computes it
    bytes: int


def header_bytes(specs: Sequence[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The length prefix and JSON header for tensors laid out back to back in `specs` order."""
    header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for spec in specs:
        if spec.name in header:
            raise ValueError(f"tensor {spec.name!r} is planned twice")
        if spec.dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {spec.name!r}: dtype {spec.dtype} cannot be stored in safetensors here")
        header[spec.name] = {"dtype": SAFETENSORS_DTYPES[spec.dtype], "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the reference writer pads so that the data starts 8-aligned
    return struct.pack("<Q", len(text)) + text


def write_safetensors(path: Path, specs: Sequence[TensorSpec], tensors: Iterable[torch.Tensor],
                      metadata: dict[str, str] | None = None) -> WrittenFile:
    """Write `tensors` (produced lazily, in `specs` order) to `path`; each must match its spec.

    A mismatch raises ValueError: the plan and the producer disagree, which is a converter bug.
    """
    head = header_bytes(specs, metadata)
    digest = hashlib.sha256(head)
    size = len(head)
    with open(path, "wb") as f:
        f.write(head)
        produced = iter(tensors)
        for spec in specs:
            tensor = next(produced, None)
            if tensor is None:
                raise ValueError(f"{path}: producer stopped before tensor {spec.name!r}")
            if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
                raise ValueError(f"{path}: tensor {spec.name!r} is {tensor.dtype} {tuple(tensor.shape)}, "
                                 f"planned {spec.dtype} {spec.shape}")
            data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            f.write(data)
            digest.update(data)
            size += spec.nbytes
            # Drop our references before asking the producer for the next tensor, so that at
            # most one produced tensor is alive at a time.
            del tensor, data
        if next(produced, None) is not None:
            raise ValueError(f"{path}: producer yielded more tensors than the {len(specs)} planned")
    return WrittenFile(sha256=digest.hexdigest(), bytes=size)
