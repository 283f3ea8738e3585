"""Converted tiny models, cached per session: `converted(family, tp, pp, ...) -> (hf_dir, out_dir)`."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardline.converter import convert

# name -> (family, make_tiny_hf_model overrides): every code path the converter has.
MODELS = {
    "llama-gqa": ("llama", {}),  # 6 heads over 2 KV heads, separate lm_head
    "llama-tied": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 6}),
    "llama-bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "qwen2": ("qwen2", {}),  # q/k/v bias only, tied
    "gptj": ("gptj", {}),  # partial rotary, parallel residual, lm_head bias
    "gpt2": ("gpt2", {}),  # Conv1D, fused qkv, learned positions, tied
}


@pytest.fixture(scope="session")
def converted(tiny_hf, tmp_path_factory):
    cache: dict[str, tuple[Path, Path]] = {}

    def make(model: str, tp: int = 1, pp: int = 1, dtype: str = "fp32", stage_layers=None,
             quantization: str = "none") -> tuple[Path, Path]:
        key = repr((model, tp, pp, dtype, stage_layers, quantization))
        if key not in cache:
            family, overrides = MODELS[model]
            hf = tiny_hf(family, **overrides)
            out = tmp_path_factory.mktemp("converted") / "out"
            convert(hf, out, tp=tp, pp=pp, dtype=dtype, stage_layers=stage_layers, quantization=quantization)
            cache[key] = (hf, out)
        return cache[key]

    return make
