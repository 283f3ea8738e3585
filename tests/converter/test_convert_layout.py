"""Shard names and shapes are exactly the table in docs/shard-format.md, for every family,
tp in {1, 2} and pp in {1, 2, 3} including uneven stage splits."""

from __future__ import annotations

import pytest
from safetensors import safe_open

from shardline.config import ModelConfig
from shardline.manifest import Manifest

LAYOUTS = [(1, 1, None), (2, 1, None), (1, 2, None), (2, 2, [4, 2]), (1, 3, [1, 3, 2]), (2, 3, None)]


def expected_shard(cfg: ModelConfig, tp: int, layers: tuple[int, int], int8: bool = False) -> dict[str, tuple]:
    """The doc's table, written out: name -> shape for one (stage, rank)."""
    H, hd, I, t = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, tp
    Vp = -(-cfg.vocab_size // t) * t
    layer_norm = cfg.norm == "layer"
    shapes: dict[str, tuple] = {}

    def norm(name):
        shapes[f"{name}.weight"] = (H,)
        if layer_norm:
            shapes[f"{name}.bias"] = (H,)

    def proj(name, shape, bias):
        shapes[f"{name}.weight"] = shape
        if int8:
            shapes[f"{name}.weight_scale"] = shape[:1]
        if bias:
            shapes[f"{name}.bias"] = bias

    if layers[0] == 0:
        shapes["embed_tokens.weight"] = (Vp // t, H)
        if cfg.position == "learned":
            shapes["embed_positions.weight"] = (cfg.max_position_embeddings, H)
    for i in range(*layers):
        norm(f"layers.{i}.input_norm")
        qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) // t * hd
        proj(f"layers.{i}.qkv_proj", (qkv, H), (qkv,) if cfg.qkv_bias else None)
        proj(f"layers.{i}.o_proj", (H, cfg.num_heads // t * hd), (H,) if cfg.o_bias else None)
        if not cfg.parallel_residual:
            norm(f"layers.{i}.post_attention_norm")
        if cfg.activation == "silu_glu":
            proj(f"layers.{i}.gate_up_proj", (2 * I // t, H), (2 * I // t,) if cfg.mlp_bias else None)
        else:
            proj(f"layers.{i}.up_proj", (I // t, H), (I // t,) if cfg.mlp_bias else None)
        proj(f"layers.{i}.down_proj", (H, I // t), (H,) if cfg.mlp_bias else None)
    if layers[1] == cfg.num_layers:
        norm("norm")
        shapes["lm_head.weight"] = (Vp // t, H)
        if cfg.lm_head_bias:
            shapes["lm_head.bias"] = (Vp // t,)
    return shapes


def shard_shapes(path) -> dict[str, tuple]:
    with safe_open(str(path), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.mark.parametrize("tp,pp,stage_layers", LAYOUTS)
@pytest.mark.parametrize("model", ["llama-gqa", "llama-bias", "qwen2", "gptj", "gpt2"])
def test_names_and_shapes_match_the_doc(converted, model, tp, pp, stage_layers):
    _, out = converted(model, tp, pp, stage_layers=stage_layers)
    m = Manifest.read(out)
    assert (m.tp, m.pp) == (tp, pp)
    if stage_layers:
        assert [s.num_layers for s in m.stages] == stage_layers
    assert m.stages[0].layer_start == 0 and m.stages[-1].layer_end == m.model.num_layers
    assert all(a.layer_end == b.layer_start for a, b in zip(m.stages, m.stages[1:])), "stages must tile the layers"
    assert sorted((s.stage, s.rank) for s in m.shards) == [(s, r) for s in range(pp) for r in range(tp)]
    for shard in m.shards:
        stage = m.stage(shard.stage)
        want = expected_shard(m.model, tp, (stage.layer_start, stage.layer_end))
        assert shard_shapes(out / shard.file) == want, f"{model} tp={tp} pp={pp} {shard.file}"


@pytest.mark.parametrize("quantization", ["int8-weight-only", "fp8-weight-only"])
@pytest.mark.parametrize("model", ["llama-gqa", "gpt2"])
def test_weight_only_quantization_adds_a_scale_per_projection(converted, model, quantization):
    _, out = converted(model, 2, 2, quantization=quantization)
    m = Manifest.read(out)
    assert m.quantization == quantization
    for shard in m.shards:
        stage = m.stage(shard.stage)
        want = expected_shard(m.model, 2, (stage.layer_start, stage.layer_end), int8=True)
        assert shard_shapes(out / shard.file) == want
