"""Tensors as raw bytes with shape and dtype: how activations cross a stage boundary.

Never pickled, never element by element: one `bytes` per tensor, validated on receipt.
"""

from __future__ import annotations

import torch

DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
}
DTYPES_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}
MODEL_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class WireError(ValueError):
    """A tensor on the wire does not match what the receiver expects."""


def tensor_to_bytes(x: torch.Tensor) -> tuple[bytes, list[int], str]:
    if x.dtype not in DTYPE_NAMES:
        raise WireError(f"dtype {x.dtype} cannot cross the wire; use one of {sorted(DTYPES_BY_NAME)}")
    x = x.detach().contiguous().cpu()
    # bf16 has no numpy dtype: move the bits as int16, same bytes.
    raw = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
    return raw.numpy().tobytes(), list(x.shape), DTYPE_NAMES[x.dtype]


def tensor_from_bytes(data: bytes, shape: list[int] | tuple[int, ...], dtype: str,
                      device: torch.device | str = "cpu") -> torch.Tensor:
    if dtype not in DTYPES_BY_NAME:
        raise WireError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES_BY_NAME)}")
    torch_dtype = DTYPES_BY_NAME[dtype]
    numel = 1
    for d in shape:
        if d < 0:
            raise WireError(f"negative dimension in shape {list(shape)}")
        numel *= d
    itemsize = torch.empty(0, dtype=torch_dtype).element_size()
    if len(data) != numel * itemsize:
        raise WireError(f"tensor payload is {len(data)} bytes but shape {list(shape)} of {dtype} "
                        f"needs {numel * itemsize}")
    if numel == 0:
        return torch.empty(tuple(shape), dtype=torch_dtype, device=device)
    flat = torch.frombuffer(bytearray(data), dtype=torch_dtype)
    return flat.view(tuple(shape)).to(device)
