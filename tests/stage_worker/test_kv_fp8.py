"""An fp8 (e4m3) KV cache (`--kv-cache-dtype fp8`): a quarter of an fp32 cache's bytes a token and
half a bf16 one's, so that many times the tokens fit; and a model that reads its K and V at that
rounding on every path (prefill, chunked prefill, decode). The GPU kernels are held to the same
rounding in tests/kernels and tests/stage_worker/test_gpu_engine.py."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from shardline.config import ConfigError, EngineConfig
from shardline.converter import convert
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import LocalPipeline
from shardline.tiny import make_tiny_hf_model

PROMPTS = [[1, 5, 9], [1] + list(range(10, 40)), [2], [9] * 17]
FP8 = EngineConfig(num_blocks=64, kv_cache_dtype="fp8")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv-fp8")
    convert(make_tiny_hf_model(root / "hf", "llama"), root / "model", tp=1, pp=2, dtype="fp32")
    return root / "model"


def test_the_same_bytes_hold_four_times_an_fp32_caches_tokens(model):
    budget = 3 << 20
    auto = LocalPipeline(model, config=EngineConfig(kv_cache_bytes=budget))
    fp8 = LocalPipeline(model, config=EngineConfig(kv_cache_bytes=budget, kv_cache_dtype="fp8"))
    for a, f in zip(auto.engines, fp8.engines):
        assert (a.kv_cache.k.dtype, f.kv_cache.k.dtype) == (torch.float32, torch.float8_e4m3fn)
        assert f.block_manager.num_blocks == 4 * a.block_manager.num_blocks
        assert f.kv_cache.k.nbytes + f.kv_cache.v.nbytes <= budget


def test_decode_reads_the_keys_and_values_prefill_wrote(model):
    """Greedy tokens from decode steps over the e4m3 cache are the argmax of one prefill over the
    prompt and the tokens before them: every path rounds K and V to e4m3 alike. A 16-token budget
    chunks the longer prompts' prefill, so later chunks read earlier ones from the cache."""
    pipeline = LocalPipeline(model, config=EngineConfig(num_blocks=64, kv_cache_dtype="fp8",
                                                        max_num_batched_tokens=16))
    got = pipeline.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    for prompt, tokens in zip(PROMPTS, got):
        forced = pipeline.logits(prompt + tokens[:-1])[len(prompt) - 1:]
        assert forced.argmax(-1).tolist() == tokens


def test_logits_move_by_the_rounding_of_k_and_v_only(model):
    """The e4m3 cache changes the logits (it is in use), by a few percent of their largest at most
    (3.2-3.6% on this random model, whose logits are all small)."""
    auto = LocalPipeline(model, config=EngineConfig(num_blocks=64))
    fp8 = LocalPipeline(model, config=FP8)
    for prompt in PROMPTS:
        want, got = auto.logits(prompt), fp8.logits(prompt)
        err, scale = (got - want).abs().max().item(), want.abs().max().item()
        assert 0 < err <= 0.08 * scale, f"fp8 KV moved the logits by {err:.3g} (max |logit| {scale:.3g})"


def test_an_unknown_cache_type_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"--kv-cache-dtype 'int8' is not a KV-cache type; use auto \(the "
                                          r"model's dtype\) or fp8"):
        EngineConfig(kv_cache_dtype="int8")


def test_a_gpu_without_e4m3_conversions_is_refused_naming_the_fix(monkeypatch):
    """An A100 (8.0) has no e4m3 conversions: the worker stops at startup saying what to use."""
    from shardline.stage_worker.kv_cache import kv_cache_dtype
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ConfigError, match=r"--kv-cache-dtype fp8 needs a GPU that converts to e4m3 \(compute "
                                          r"capability 8.9 or later.*is 8.0: use --kv-cache-dtype auto"):
        kv_cache_dtype("fp8", torch.bfloat16, torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert kv_cache_dtype("fp8", torch.bfloat16, torch.device("cuda")) == torch.float8_e4m3fn
    assert kv_cache_dtype("auto", torch.bfloat16, torch.device("cuda")) == torch.bfloat16


# Keys 1,024 times larger saturate an unscaled e4m3 cache (+-448); values 1,024 times smaller fall
# below its smallest subnormal (2^-9) and round to zero. Powers of two: fp32 stores them exactly.
K_SCALE, V_SCALE = 1024.0, 2.0 ** -10


@pytest.fixture(scope="module")
def rescaled(tmp_path_factory):
    """The `model` fixture's checkpoint with its keys K_SCALE and its values V_SCALE times larger
    (q and o divided to match: the same function), converted with its scales and without them."""
    from safetensors.torch import load_file, save_file

    from shardline.tiny import add_fp8_kv_scales

    root = tmp_path_factory.mktemp("kv-fp8-scaled")
    hf = add_fp8_kv_scales(make_tiny_hf_model(root / "hf", "llama"), K_SCALE, V_SCALE)
    convert(hf, root / "scaled", tp=1, pp=2, dtype="fp32")
    state = load_file(hf / "model.safetensors")
    save_file({n: t for n, t in state.items() if not n.endswith(("k_scale", "v_scale"))}, hf / "model.safetensors",
              metadata={"format": "pt"})
    convert(hf, root / "unscaled", tp=1, pp=2, dtype="fp32")
    return root


def test_a_checkpoints_kv_scales_bring_its_keys_and_values_into_e4m3s_range(model, rescaled, caplog):
    """Over an e4m3 cache the rescaled model reads, with its checkpoint's scales, what the original
    model reads (its logits within rounding of the original's over the same cache); without them
    its keys saturate and its values vanish. Over a cache of the model's dtype the scales are
    unused, and all three are one function."""
    caplog.set_level("INFO", logger="shardline.stage_worker")
    plain = LocalPipeline(model, config=FP8)
    scaled = LocalPipeline(rescaled / "scaled", config=FP8)
    unscaled = LocalPipeline(rescaled / "unscaled", config=FP8)
    assert "KV cache (float8_e4m3fn, k/v scales from the checkpoint) of 64 blocks" in caplog.text, \
        "the worker's log says which cache it reads the checkpoint's scales for"
    assert [layer.kv_scales for e in scaled.engines for layer in e.model.layers] == [(K_SCALE, V_SCALE)] * 6
    exact = LocalPipeline(model, config=EngineConfig(num_blocks=64))
    for prompt in PROMPTS:
        want, fp8 = exact.logits(prompt), plain.logits(prompt)
        fp8_err = (fp8 - want).abs().max().item()
        scaled_err = (scaled.logits(prompt) - fp8).abs().max().item()
        unscaled_err = (unscaled.logits(prompt) - want).abs().max().item()
        assert scaled_err <= 0.1 * fp8_err, f"with scales {scaled_err:.3g} off the original over e4m3 ({fp8_err:.3g})"
        assert unscaled_err > 5 * fp8_err, f"without scales only {unscaled_err:.3g} off: the case tests nothing"
    for path in (rescaled / "scaled", rescaled / "unscaled"):
        got = LocalPipeline(path, config=EngineConfig(num_blocks=64)).logits(PROMPTS[1])
        assert torch.allclose(got, exact.logits(PROMPTS[1]), rtol=1e-4, atol=1e-4), f"{path.name} over fp32"


def test_a_shard_with_one_scale_of_the_pair_is_refused(rescaled, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "model"
    shutil.copytree(rescaled / "scaled", broken)
    shard = broken / "stage-1" / "rank-0.safetensors"
    save_file({n: t for n, t in load_file(shard).items() if n != "layers.4.v_scale"}, shard)
    with pytest.raises(ConfigError, match=r"the shard has layers.4.k_scale but no layers.4.v_scale; an fp8 KV cache "
                                          r"needs both or neither: re-run `shardline convert`"):
        LocalPipeline(broken, config=dataclasses.replace(FP8, verify_checksums=False))
