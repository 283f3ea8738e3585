"""Weight-only int8 and fp8 models run end to end and stay close to the model they came from."""

from __future__ import annotations

import pytest

from shardline.config import ConfigError, EngineConfig
from shardline.converter import convert
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import LocalPipeline
from shardline.tiny import make_tiny_hf_model

PROMPT = [1, 5, 9, 200, 31, 7, 7, 64]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")
    hf = make_tiny_hf_model(root / "hf", "llama")
    out = {}
    for q in ("none", "int8-weight-only", "fp8-weight-only"):
        out[q] = root / q
        convert(hf, out[q], tp=1, pp=2, dtype="fp32", quantization=q)
    return out


@pytest.mark.parametrize("quant,tol", [("int8-weight-only", 0.02), ("fp8-weight-only", 0.08)])
def test_quantized_logits_stay_close_and_generation_runs(models, quant, tol):
    config = EngineConfig(num_blocks=64)
    dense = LocalPipeline(models["none"], config=config).logits(PROMPT)
    pipeline = LocalPipeline(models[quant], config=config)
    weight = pipeline.engines[0].model.layers[0].qkv_proj.weight
    assert weight.element_size() == 1, "the projections should stay 1-byte weights in memory"
    logits = pipeline.logits(PROMPT)
    rel = ((logits - dense).norm() / dense.norm()).item()
    # e4m3 keeps 3 mantissa bits to int8's ~7: a few percent of the logits' norm against ~1%.
    assert rel < tol, f"{quant}: logits moved by {rel:.3f} of their norm"
    out = pipeline.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert len(out) == 12


def test_an_unknown_quantization_is_refused(tmp_path):
    hf = make_tiny_hf_model(tmp_path / "hf", "llama")
    with pytest.raises(ConfigError, match="quantization 'int4' is not one of"):
        convert(hf, tmp_path / "out", tp=1, pp=1, dtype="fp32", quantization="int4")
