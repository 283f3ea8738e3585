"""MLP activations. `silu_and_mul` takes the fused gate/up projection output [T, 2I]."""

from __future__ import annotations

import math

import torch

from ._dispatch import use_triton


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)  # (T, I) each
    return torch.nn.functional.silu(gate) * up


def gelu_tanh_ref(x: torch.Tensor) -> torch.Tensor:
    # GPT-2/GPT-J "gelu_new": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        from .triton_activation import silu_and_mul_triton
        return silu_and_mul_triton(x)
    return silu_and_mul_ref(x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        from .triton_activation import gelu_tanh_triton
        return gelu_tanh_triton(x)
    return gelu_tanh_ref(x)
