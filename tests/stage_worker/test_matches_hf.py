"""The engine computes what HuggingFace computes: logits at every position within 1e-4 (fp32)
and greedy generation token-identical to `generate()`, for every family and every TP x PP layout.

If these fail, every number the serving system returns is wrong, however fast.
"""

from __future__ import annotations

import functools

import pytest
import torch

from shardline.converter import convert
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import run_local
from shardline.tiny import make_tiny_hf_model

# (family, HF overrides): grouped KV heads untied, tied embeddings, Qwen2 biases, GPT-J, GPT-2.
MODELS = {
    "llama-gqa": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 6}),
    "qwen2": ("qwen2", {}),
    "gptj": ("gptj", {}),
    "gpt2": ("gpt2", {}),
}
# (tp, pp, stage layer counts or None for an even split); the tiny models have 6 layers.
LAYOUTS = [(1, 1, None), (2, 1, None), (1, 2, None), (2, 2, [4, 2]), (1, 3, [1, 3, 2]), (2, 3, None)]
PROMPT = [1, 17, 42, 99, 7, 250, 3, 64, 128, 5, 33]
NEW_TOKENS = 32


@functools.cache
def hf_reference(model_dir: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        logits = model(ids).logits[0]
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False)[0, len(PROMPT):].tolist()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    for i, t in enumerate(out):  # HF pads after eos; the engine stops at it
        if t in eos:
            out = out[:i + 1]
            break
    return logits, out


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {name: str(make_tiny_hf_model(root / name, family, seed=i, **overrides))
            for i, (name, (family, overrides)) in enumerate(MODELS.items())}


@pytest.mark.parametrize("tp,pp,stage_layers", LAYOUTS, ids=lambda v: str(v))
@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_greedy_match_hf(name, tp, pp, stage_layers, hf_models, tmp_path):
    hf_dir = hf_models[name]
    out = tmp_path / "converted"
    convert(hf_dir, out, tp=tp, pp=pp, dtype="fp32", stage_layers=stage_layers)
    logits, generated = run_local(out, [("logits", (PROMPT,)),
                                        ("generate", ([PROMPT], SamplingParams(max_tokens=NEW_TOKENS)))])
    ref_logits, ref_tokens = hf_reference(hf_dir)
    err = (logits - ref_logits).abs().max().item()
    assert err < 1e-4, f"{name} tp={tp} pp={pp}: logits differ from HF by {err:.2e} (bar 1e-4)"
    assert generated[0] == ref_tokens, f"{name} tp={tp} pp={pp}: greedy tokens diverge from HF generate()"
