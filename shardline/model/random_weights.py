"""Random weights in the shard format, built straight on the device: benchmarks at real model
shapes (Llama-3-8B, GPT-J-6B) without writing or reading 16 GB of checkpoint.

Names and shapes come from the converter's plan, so these tensors are exactly what a converted
shard of that model would hold; only the values are random (std 0.02, norms at 1).
"""

from __future__ import annotations

import torch

from shardline.config import ModelConfig
from shardline.converter.families import plan_shard
from shardline.kernels.quant import WEIGHT_ONLY
from shardline.manifest import Manifest, StageSpec
from shardline.wire import MODEL_DTYPES

LLAMA3_8B = dict(architecture="llama", vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32,
                 num_kv_heads=8, head_dim=128, intermediate_size=14336, max_position_embeddings=8192,
                 norm="rms", norm_eps=1e-5, activation="silu_glu", position="rotary", rotary_dim=128,
                 rope_theta=500000.0, rope_scaling=None, parallel_residual=False, qkv_bias=False,
                 o_bias=False, mlp_bias=False, lm_head_bias=False, tie_word_embeddings=False)
GPTJ_6B = dict(architecture="gptj", vocab_size=64512, hidden_size=4096, num_layers=28, num_heads=16,
               num_kv_heads=16, head_dim=256, intermediate_size=16384, max_position_embeddings=2048,
               norm="layer", norm_eps=1e-5, activation="gelu_tanh", position="rotary", rotary_dim=64,
               rope_theta=10000.0, rope_scaling=None, parallel_residual=True, qkv_bias=False, o_bias=False,
               mlp_bias=True, lm_head_bias=True, tie_word_embeddings=False)
# A small shape for exercising the same paths on a CPU (tests, CPU runs of the benchmarks).
LLAMA_SMALL = {**LLAMA3_8B, "vocab_size": 1000, "hidden_size": 128, "num_layers": 2, "num_heads": 4,
               "num_kv_heads": 2, "head_dim": 32, "rotary_dim": 32, "intermediate_size": 256,
               "max_position_embeddings": 1024}
GPTJ_SMALL = {**GPTJ_6B, "vocab_size": 1000, "hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 4,
              "head_dim": 32, "rotary_dim": 16, "intermediate_size": 512, "max_position_embeddings": 1024}
GPT2_SMALL = {**GPTJ_SMALL, "architecture": "gpt2", "position": "learned", "rotary_dim": 0, "parallel_residual": False,
              "qkv_bias": True, "o_bias": True, "lm_head_bias": False}
SHAPES = {"llama3-8b": LLAMA3_8B, "gptj-6b": GPTJ_6B, "llama-small": LLAMA_SMALL, "gptj-small": GPTJ_SMALL,
          "gpt2-small": GPT2_SMALL}


def random_manifest(cfg: ModelConfig, dtype: str, tp: int = 1, pp: int = 1, quantization: str = "none") -> Manifest:
    from shardline.config import split_layers

    stages = tuple(StageSpec(i, a, b) for i, (a, b) in enumerate(split_layers(cfg.num_layers, pp)))
    return Manifest(model=cfg, dtype=dtype, quantization=quantization, tp=tp, pp=pp,
                    stages=stages, shards=(), source={"random": True})


@torch.inference_mode()
def random_stage_weights(manifest: Manifest, stage: int, rank: int, device: torch.device | str,
                         seed: int = 0) -> dict[str, torch.Tensor]:
    cfg, spec = manifest.model, manifest.stage(stage)
    dtype = MODEL_DTYPES[manifest.dtype]
    gen = torch.Generator(device=device).manual_seed(seed * 1000 + stage * 10 + rank)
    weights = {}
    for t in plan_shard(cfg, (spec.layer_start, spec.layer_end), manifest.tp, rank):
        if "norm" in t.name and t.name.endswith(".weight"):
            weights[t.name] = torch.ones(t.shape, dtype=dtype, device=device)
            continue
        # drawn in fp32, then rounded: the same weights on every torch version (a bf16 normal_ on the
        # CPU has changed between versions, and with it how its exponents spread)
        w = torch.empty(t.shape, dtype=torch.float32, device=device).normal_(0.0, 0.02, generator=gen).to(dtype)
        if manifest.quantization in WEIGHT_ONLY and t.is_projection:
            weights[t.name], weights[t.name + "_scale"] = WEIGHT_ONLY[manifest.quantization][1](w, dtype)
        else:
            weights[t.name] = w
    return weights
