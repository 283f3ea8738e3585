"""The paged KV cache tensors of one stage on one rank, sized from a memory budget."""

from __future__ import annotations

import torch

from shardline.config import ConfigError


def kv_cache_dtype(name: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The cache's element type for EngineConfig.kv_cache_dtype `name` ("auto" or "fp8")."""
    if name == "auto":
        return model_dtype
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise ConfigError(f"--kv-cache-dtype fp8 needs a GPU that converts to e4m3 (compute capability 8.9 or "
                          f"later: Ada, Hopper, Blackwell); {device} is {major}.{minor}: use --kv-cache-dtype auto")
    return torch.float8_e4m3fn


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
    """k and v for every layer of the stage (this rank's KV heads only)."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def plan_num_blocks(budget_bytes: int, num_layers: int, block_size: int, num_kv_heads: int,
                    head_dim: int, dtype: torch.dtype) -> int:
    per_block = bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
    n = budget_bytes // per_block
    if n < 1:
        raise ConfigError(f"KV-cache budget of {budget_bytes} bytes is below one block ({per_block} bytes); "
                          f"raise --kv-cache-bytes or lower --block-size")
    return int(n)


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks, self.block_size = num_blocks, block_size

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim]."""
        return [(self.k[i], self.v[i]) for i in range(self.k.shape[0])]
