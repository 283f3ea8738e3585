"""A checkpoint quantized for an fp8 KV cache carries each layer's per-tensor k and v scales; the
converter finds them under the names such checkpoints use and writes them to every shard of the
layer (one fp32 value each, the same on every rank), or refuses a checkpoint whose scales are
partial or not positive, finite values, naming the tensor and writing nothing."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from shardline.config import ConfigError
from shardline.converter import convert
from shardline.manifest import Manifest, shard_file
from shardline.tiny import add_fp8_kv_scales

K_SCALE, V_SCALE = 37.5, 0.0125


def _scaled(tiny_hf, tmp_path, family="llama", naming="attention"):
    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf(family), hf)
    return add_fp8_kv_scales(hf, K_SCALE, V_SCALE, naming)


@pytest.mark.parametrize("family,naming", [("llama", "attention"), ("llama", "projection"), ("gptj", "attention")])
def test_every_shard_of_a_layer_gets_its_scales(tiny_hf, tmp_path, family, naming):
    hf = _scaled(tiny_hf, tmp_path, family, naming)
    manifest = convert(hf, tmp_path / "out", tp=2, pp=2, dtype="bf16")
    for stage in manifest.stages:
        layers = range(stage.layer_start, stage.layer_end)
        for rank in range(2):
            shard = load_file(tmp_path / "out" / shard_file(stage.stage, rank))
            assert {n for n in shard if n.endswith(("k_scale", "v_scale"))} == {
                f"layers.{i}.{kind}_scale" for i in layers for kind in "kv"}, "each of the stage's layers, once"
            for i in layers:
                for kind, want in (("k", K_SCALE), ("v", V_SCALE)):
                    t = shard[f"layers.{i}.{kind}_scale"]
                    assert t.dtype == torch.float32 and t.shape == (1,), "a scale stays fp32 whatever --dtype"
                    assert t.item() == pytest.approx(want, rel=1e-6)
    ends = {"attention": ("attn.k_scale", "attn.v_scale"), "projection": ("k_proj.k_scale", "v_proj.v_scale")}[naming]
    recorded = Manifest.read(tmp_path / "out").source["kv_scales"]  # where they came from, for a reader
    assert recorded["layers"] == manifest.model.num_layers, recorded
    assert all(".0." in name and name.endswith(end) for name, end in zip(recorded["layer_0"], ends)), recorded

def test_a_checkpoint_without_scales_writes_none(converted):
    _, out = converted("llama-gqa")
    assert not [name for name in load_file(out / shard_file(0, 0)) if name.endswith(("k_scale", "v_scale"))]
    assert "kv_scales" not in Manifest.read(out).source


def test_int8_weight_only_leaves_the_scales_as_they_are(tiny_hf, tmp_path):
    hf = _scaled(tiny_hf, tmp_path)
    convert(hf, tmp_path / "out", tp=1, pp=1, dtype="bf16", quantization="int8-weight-only")
    shard = load_file(tmp_path / "out" / shard_file(0, 0))
    assert shard["layers.0.k_scale"].dtype == torch.float32 and shard["layers.0.k_scale"].item() == K_SCALE
    assert shard["layers.0.qkv_proj.weight"].dtype == torch.int8


def _edit(hf, **tensors):
    state = load_file(hf / "model.safetensors")
    for name, value in tensors.items():
        if value is None:
            del state[name]
        else:
            state[name] = value
    save_file(state, hf / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("edit,message", [
    ({"model.layers.3.self_attn.k_scale": None, "model.layers.3.self_attn.v_scale": None},
     r"has KV-cache scales for 5 of 6 layers but none for layer 3 \(looked for model.layers.3.self_attn.k_scale"),
    ({"model.layers.2.self_attn.v_scale": torch.tensor(0.0)},
     r"'model.layers.2.self_attn.v_scale': v_scale is 0.0; a KV-cache scale must be positive and finite"),
    ({"model.layers.1.self_attn.k_scale": torch.tensor(float("inf"))}, r"k_scale is inf"),
    ({"model.layers.0.self_attn.k_scale": torch.ones(4)},
     r"tensor 'model.layers.0.self_attn.k_scale' has shape \[4\]; a per-tensor scale has one value"),
], ids=["partial", "zero", "infinite", "per-channel"])
def test_bad_scales_are_refused_naming_the_tensor_and_nothing_is_written(tiny_hf, tmp_path, edit, message):
    hf = _scaled(tiny_hf, tmp_path)
    _edit(hf, **edit)
    with pytest.raises(ConfigError, match=message):
        convert(hf, tmp_path / "out", tp=1, pp=2, dtype="bf16")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.tmp-*"))
