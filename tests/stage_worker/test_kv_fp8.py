"""An fp8 (e4m3) KV cache (`--kv-cache-dtype fp8`): a quarter of an fp32 cache's bytes a token and
half a bf16 one's, so that many times the tokens fit; and a model that reads its K and V at that
rounding on every path (prefill, chunked prefill, decode). The GPU kernels are held to the same
rounding in tests/kernels and tests/stage_worker/test_gpu_engine.py."""

from __future__ import annotations

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
