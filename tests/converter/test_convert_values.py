"""Shard contents: putting the ranks back together gives the HF weights, exactly."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from shardline.converter import convert
from shardline.manifest import Manifest, sha256_file
from shardline.wire import MODEL_DTYPES

LAYOUTS = [(1, 1, None), (2, 1, None), (2, 2, [4, 2]), (2, 3, None), (1, 3, [1, 3, 2])]


def load_shards(out) -> tuple[Manifest, dict[str, list[torch.Tensor]]]:
    """name -> the tensor on each rank. Names are global, so every name lives on one stage."""
    m = Manifest.read(out)
    ranks: dict[str, list] = defaultdict(lambda: [None] * m.tp)
    stage_of: dict[str, int] = {}
    for shard in m.shards:
        with safe_open(str(out / shard.file), framework="pt") as f:
            for name in f.keys():
                assert stage_of.setdefault(name, shard.stage) == shard.stage, f"{name} on two stages"
                ranks[name][shard.rank] = f.get_tensor(name)
    return m, dict(ranks)


def hf_state(hf_dir) -> dict[str, torch.Tensor]:
    files = sorted(hf_dir.glob("*.safetensors"))
    state = {}
    for f in files:
        state.update(load_file(f))
    return state


def gptj_unpermute(w: torch.Tensor, heads: int, head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Inverse of the rotate-half permutation: rows [evens..., odds...] back to interleaved pairs."""
    w = w.reshape(heads, head_dim, *w.shape[1:])
    half = rotary_dim // 2
    rot = torch.stack([w[:, :half], w[:, half:rotary_dim]], dim=2).reshape(heads, rotary_dim, *w.shape[2:])
    return torch.cat([rot, w[:, rotary_dim:]], dim=1).reshape(heads * head_dim, *w.shape[2:])


def unshard(m: Manifest, ranks: dict[str, list[torch.Tensor]], family: str) -> dict[str, torch.Tensor]:
    """Rebuild the HF state dict (HF names, HF layouts) from the per-rank shard tensors."""
    cfg, tp = m.model, m.tp
    V, hd = cfg.vocab_size, cfg.head_dim
    q_rank, kv_rank = cfg.num_heads // tp * hd, cfg.num_kv_heads // tp * hd
    rows = lambda name: torch.cat(ranks[name], 0)  # noqa: E731
    cols = lambda name: torch.cat(ranks[name], 1)  # noqa: E731
    once = lambda name: ranks[name][0]  # noqa: E731  (replicated: checked equal on every rank below)

    def vocab(name):
        t = rows(name)
        assert t.shape[0] == m.model.padded_vocab_size(tp)
        assert not t[V:].any(), f"{name}: padded vocab rows must be zero"
        return t[:V]

    def qkv(name):
        per_rank = [t.split([q_rank, kv_rank, kv_rank]) for t in ranks[name]]
        return [torch.cat([p[j] for p in per_rank]) for j in range(3)]

    def halves(name):
        per_rank = [t.chunk(2) for t in ranks[name]]
        return torch.cat([p[0] for p in per_rank]), torch.cat([p[1] for p in per_rank])

    for name, ts in ranks.items():
        if name.endswith("norm.weight") or name.endswith("norm.bias") or name in (
                "embed_positions.weight",) or name.endswith(("o_proj.bias", "down_proj.bias")):
            assert all(torch.equal(t, ts[0]) for t in ts), f"{name} must be replicated"

    hf: dict[str, torch.Tensor] = {}
    if family == "llama":
        hf["model.embed_tokens.weight"] = vocab("embed_tokens.weight")
        hf["model.norm.weight"] = once("norm.weight")
        hf["lm_head.weight"] = vocab("lm_head.weight")
        for i in range(cfg.num_layers):
            p, s = f"model.layers.{i}.", f"layers.{i}."
            hf[p + "input_layernorm.weight"] = once(s + "input_norm.weight")
            hf[p + "post_attention_layernorm.weight"] = once(s + "post_attention_norm.weight")
            for suffix in ("weight", "bias") if cfg.qkv_bias else ("weight",):
                for proj, t in zip("qkv", qkv(f"{s}qkv_proj.{suffix}")):
                    hf[f"{p}self_attn.{proj}_proj.{suffix}"] = t
            hf[p + "self_attn.o_proj.weight"] = cols(s + "o_proj.weight")
            if cfg.o_bias:
                hf[p + "self_attn.o_proj.bias"] = once(s + "o_proj.bias")
            for suffix in ("weight", "bias") if cfg.mlp_bias else ("weight",):
                hf[f"{p}mlp.gate_proj.{suffix}"], hf[f"{p}mlp.up_proj.{suffix}"] = halves(f"{s}gate_up_proj.{suffix}")
            hf[p + "mlp.down_proj.weight"] = cols(s + "down_proj.weight")
            if cfg.mlp_bias:
                hf[p + "mlp.down_proj.bias"] = once(s + "down_proj.bias")
    elif family == "gptj":
        hf["transformer.wte.weight"] = vocab("embed_tokens.weight")
        hf["lm_head.weight"] = vocab("lm_head.weight")
        hf["lm_head.bias"] = vocab("lm_head.bias")
        for i in range(cfg.num_layers):
            p, s = f"transformer.h.{i}.", f"layers.{i}."
            q, k, v = qkv(s + "qkv_proj.weight")
            hf[p + "attn.q_proj.weight"] = gptj_unpermute(q, cfg.num_heads, hd, cfg.rotary_dim)
            hf[p + "attn.k_proj.weight"] = gptj_unpermute(k, cfg.num_kv_heads, hd, cfg.rotary_dim)
            hf[p + "attn.v_proj.weight"] = v
            hf[p + "attn.out_proj.weight"] = cols(s + "o_proj.weight")
            hf[p + "mlp.fc_in.weight"], hf[p + "mlp.fc_in.bias"] = rows(s + "up_proj.weight"), rows(s + "up_proj.bias")
            hf[p + "mlp.fc_out.weight"] = cols(s + "down_proj.weight")
            hf[p + "mlp.fc_out.bias"] = once(s + "down_proj.bias")
            hf[p + "ln_1.weight"], hf[p + "ln_1.bias"] = once(s + "input_norm.weight"), once(s + "input_norm.bias")
    else:  # gpt2: Conv1D weights are [in, out]
        hf["transformer.wte.weight"] = vocab("embed_tokens.weight")
        hf["transformer.wpe.weight"] = once("embed_positions.weight")
        hf["lm_head.weight"] = vocab("lm_head.weight")  # tied: compared with the embedding below
        for i in range(cfg.num_layers):
            p, s = f"transformer.h.{i}.", f"layers.{i}."
            hf[p + "attn.c_attn.weight"] = torch.cat(qkv(s + "qkv_proj.weight")).t()
            hf[p + "attn.c_attn.bias"] = torch.cat(qkv(s + "qkv_proj.bias"))
            hf[p + "attn.c_proj.weight"] = cols(s + "o_proj.weight").t()
            hf[p + "attn.c_proj.bias"] = once(s + "o_proj.bias")
            hf[p + "mlp.c_fc.weight"], hf[p + "mlp.c_fc.bias"] = rows(s + "up_proj.weight").t(), rows(s + "up_proj.bias")
            hf[p + "mlp.c_proj.weight"] = cols(s + "down_proj.weight").t()
            hf[p + "mlp.c_proj.bias"] = once(s + "down_proj.bias")
            for ours, theirs in (("input_norm", "ln_1"), ("post_attention_norm", "ln_2")):
                hf[f"{p}{theirs}.weight"], hf[f"{p}{theirs}.bias"] = once(f"{s}{ours}.weight"), once(f"{s}{ours}.bias")
    if family in ("gptj", "gpt2"):
        hf["transformer.ln_f.weight"], hf["transformer.ln_f.bias"] = once("norm.weight"), once("norm.bias")
    return hf


@pytest.mark.parametrize("tp,pp,stage_layers", LAYOUTS)
@pytest.mark.parametrize("model,family", [("llama-gqa", "llama"), ("llama-tied", "llama"), ("llama-bias", "llama"),
                                          ("qwen2", "llama"), ("gptj", "gptj"), ("gpt2", "gpt2")])
def test_ranks_reassemble_into_the_hf_weights(converted, model, family, tp, pp, stage_layers):
    hf_dir, out = converted(model, tp, pp, stage_layers=stage_layers)
    m, ranks = load_shards(out)
    rebuilt = unshard(m, ranks, family)
    source = hf_state(hf_dir)
    if m.model.tie_word_embeddings:
        embed = "transformer.wte.weight" if family == "gpt2" else "model.embed_tokens.weight"
        source.setdefault("lm_head.weight", source[embed])
    assert rebuilt.keys() == source.keys(), "every HF weight must land in exactly one shard tensor"
    for name, want in source.items():
        assert torch.equal(rebuilt[name], want), f"{name} differs after tp={tp} pp={pp} round trip"


def _gptj_rotary_scores(q, k, rotary_dim, positions, interleaved):
    """Per-head q.k scores [heads, T, T] after rotary; q, k: [T, heads, head_dim]."""
    half = rotary_dim // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    angles = positions.float()[:, None] * inv_freq  # (T, rd/2)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]  # (T, 1, rd/2)

    def rotate(x):
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        if interleaved:  # GPT-J: pairs (2j, 2j+1)
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        else:  # rotate-half: pairs (j, j + rd/2)
            x1, x2 = rot[..., :half], rot[..., half:]
            out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return torch.cat([out, rest], dim=-1)

    return torch.einsum("thd,shd->hts", rotate(q), rotate(k))


def test_gptj_permutation_preserves_rotary_attention_scores(converted):
    """The engine applies rotate-half rotary to the converted q/k; the scores must equal GPT-J's
    interleaved rotary on the original weights."""
    hf_dir, out = converted("gptj", 2, 1)
    m, ranks = load_shards(out)
    cfg = m.model
    assert 0 < cfg.rotary_dim < cfg.head_dim, "the tiny GPT-J must exercise partial rotary"
    source = hf_state(hf_dir)
    x = torch.randn(9, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(9) * 7
    shape = (9, cfg.num_heads, cfg.head_dim)
    want = _gptj_rotary_scores((x @ source["transformer.h.0.attn.q_proj.weight"].t()).view(shape),
                               (x @ source["transformer.h.0.attn.k_proj.weight"].t()).view(shape),
                               cfg.rotary_dim, positions, interleaved=True)
    per_rank = []
    for r in range(m.tp):
        q_rank = cfg.num_heads // m.tp * cfg.head_dim
        q, k, _ = ranks["layers.0.qkv_proj.weight"][r].split([q_rank, q_rank, q_rank])
        local = (9, cfg.num_heads // m.tp, cfg.head_dim)
        per_rank.append(_gptj_rotary_scores((x @ q.t()).view(local), (x @ k.t()).view(local),
                                            cfg.rotary_dim, positions, interleaved=False))
    got = torch.cat(per_rank)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # The check has teeth: the unpermuted weights under rotate-half give different scores.
    wrong = _gptj_rotary_scores((x @ source["transformer.h.0.attn.q_proj.weight"].t()).view(shape),
                                (x @ source["transformer.h.0.attn.k_proj.weight"].t()).view(shape),
                                cfg.rotary_dim, positions, interleaved=False)
    assert not torch.allclose(wrong, want, atol=1e-4)


@pytest.mark.parametrize("model", ["llama-gqa", "gpt2"])
def test_checksums_in_manifest_match_files(converted, model):
    _, out = converted(model, 2, 2)
    m = Manifest.read(out)
    for shard in m.shards:
        path = out / shard.file
        assert shard.sha256 == sha256_file(path), f"{shard.file}: stage workers verify this checksum on load"
        assert shard.bytes == path.stat().st_size


def test_tokenizer_files_are_copied_and_listed(converted):
    hf_dir, out = converted("llama-gqa")
    m = Manifest.read(out)
    assert set(m.tokenizer_files) == {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}
    for name in m.tokenizer_files:
        assert (out / name).read_bytes() == (hf_dir / name).read_bytes()
    assert m.model.bos_token_id == 1 and m.model.eos_token_ids == (2,)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("weights", [{"weights_format": "bin"}, {"max_shard_size": "300KB"}])
def test_bin_and_sharded_checkpoints_give_identical_shards(tiny_hf, converted, tmp_path, family, weights):
    model = "llama-gqa" if family == "llama" else "gpt2"
    _, reference = converted(model, 2, 2)
    hf = tiny_hf(family, **weights)  # same seed, so the same weights in another container
    assert not (hf / "model.safetensors").exists()
    m = convert(hf, tmp_path / "out", tp=2, pp=2, dtype="fp32")
    want = Manifest.read(reference)
    assert [s.sha256 for s in m.shards] == [s.sha256 for s in want.shards]


@pytest.mark.parametrize("dtype,torch_dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_half_dtypes_are_the_cast_weights(converted, dtype, torch_dtype):
    _, ref = converted("qwen2", 2, 1)
    _, out = converted("qwen2", 2, 1, dtype=dtype)
    _, want = load_shards(ref)
    m, got = load_shards(out)
    assert m.dtype == dtype
    for name, ts in got.items():
        for r, t in enumerate(ts):
            assert t.dtype == torch_dtype and torch.equal(t, want[name][r].to(torch_dtype)), name


# Per scheme: stored dtype, the largest code, and the bound on |dequantised - w| (half a step:
# int8 steps are `scale`; e4m3 keeps 3 mantissa bits, so half a step is 2^-4 of the value, or
# 2^-10 of the scale among the subnormals).
HALF_STEP = {
    "int8-weight-only": (torch.int8, 127, lambda w, scale: scale * 0.5),
    "fp8-weight-only": (torch.float8_e4m3fn, 448, lambda w, scale: (w.abs() * 2 ** -4).clamp_min(scale * 2 ** -10)),
}


@pytest.mark.parametrize("quant", list(HALF_STEP))
@pytest.mark.parametrize("model,dtype", [("llama-gqa", "fp32"), ("gptj", "bf16"), ("gpt2", "fp16")])
def test_weight_only_dequantizes_within_half_a_step(converted, model, dtype, quant):
    q_dtype, q_max, half_step = HALF_STEP[quant]
    _, ref = converted(model, 2, 2)
    _, out = converted(model, 2, 2, dtype=dtype, quantization=quant)
    _, want = load_shards(ref)
    m, got = load_shards(out)
    quantized = [n for n in got if n.endswith("_proj.weight")]
    assert quantized and all(n + "_scale" in got for n in quantized)
    for name in quantized:
        for r in range(m.tp):
            q, scale, w = got[name][r], got[name + "_scale"][r], want[name][r]
            assert q.dtype == q_dtype and scale.dtype == got["norm.weight"][0].dtype
            step = scale.float()[:, None]
            err = (q.float() * step - w).abs()
            assert (err <= half_step(w, step) + 1e-7).all(), f"{name}: {quant} error above half a step"
            torch.testing.assert_close(scale.float(), (w.abs().amax(1) / q_max).to(scale.dtype).float())
    for name in ("embed_tokens.weight", "lm_head.weight"):
        assert got[name][0].dtype == MODEL_DTYPES[dtype], "embeddings and the LM head stay in the model dtype"


def test_chat_template_file_is_copied(tiny_hf, tmp_path):
    """Newer checkpoints keep their chat template in chat_template.jinja; the tokenizer service reads it."""
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf("llama"), hf)
    (hf / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    m = convert(hf, tmp_path / "out", tp=1, pp=1, dtype="fp32")
    assert "chat_template.jinja" in m.tokenizer_files
    assert (tmp_path / "out" / "chat_template.jinja").read_text() == (hf / "chat_template.jinja").read_text()
