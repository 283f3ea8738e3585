"""Tiny HuggingFace checkpoints made on the spot, with random weights and a trained tokenizer.

`make_tiny_hf_model(dir, family)` writes a real checkpoint directory (config.json, weights,
tokenizer.json, tokenizer_config.json, generation_config.json) that `shardline convert` and
`transformers` both load. `shardline up` and the tests use it, so nothing is ever downloaded.

The defaults are small but deliberately odd: 6 heads over 2 KV heads (grouped-query attention),
partial rotary for GPT-J, an MLP width of 200 and a vocabulary of 301 (not a multiple of the
tensor-parallel degree, so vocab padding is exercised). Overrides are HF config keyword arguments
of the family's config class (`num_hidden_layers=2` for llama, `n_layer=2` for gpt2/gptj).

    python -m shardline.tiny OUT --family gptj
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

FAMILIES = ("llama", "qwen2", "gptj", "gpt2")
WEIGHTS_FORMATS = ("safetensors", "bin")
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: pad, bos, eos
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Enough distinct byte pairs for the BPE trainer to reach a few hundred tokens; Korean and emoji
# are multi-byte in UTF-8, so decoding must cope with tokens that split a character.
CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Pipeline stages pass activations; tensor-parallel ranks all-reduce partial sums.",
    "A shard is one stage and one rank of the converted model.",
    "Hello, world! How are you today? I am fine, thank you.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2048 65536.",
    "def forward(self, x):\n    return self.norm(x + self.attn(x))",
    "안녕하세요, 만나서 반갑습니다.",
    "오늘 날씨가 정말 좋네요. 산책하러 갈까요?",
    "한국어 토크나이저 테스트 문장입니다.",
    "Emoji time 😀 🚀 🎉 👍 ❤️ 🤖 and more 🙂.",
    "the user asked the assistant a question and the assistant answered the user",
    "system: you are a helpful assistant. user: hi! assistant: hello there.",
)

_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                  num_hidden_layers=6, intermediate_size=200, vocab_size=301,
                  max_position_embeddings=256, tie_word_embeddings=False),
    # Qwen2: q/k/v biases, tied embeddings, like the small Qwen2 checkpoints.
    "qwen2": dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
                  num_hidden_layers=6, intermediate_size=200, vocab_size=301,
                  max_position_embeddings=256, tie_word_embeddings=True),
    # GPT-J: partial rotary (8 of 16 head dims), parallel residual, lm_head with bias.
    "gptj": dict(n_embd=96, n_head=6, n_layer=6, n_inner=200, rotary_dim=8, vocab_size=301,
                 n_positions=256),
    "gpt2": dict(n_embd=96, n_head=6, n_layer=6, n_inner=200, vocab_size=301, n_positions=256,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
}


def _model_classes(family: str):
    import transformers  # a test/dev dependency; imported only when a tiny model is made

    return {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "gptj": (transformers.GPTJConfig, transformers.GPTJForCausalLM),
        "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
    }[family]


def make_tiny_hf_model(out_dir: str | Path, family: str = "llama", *, seed: int = 0,
                       weights_format: str = "safetensors", max_shard_size: str | None = None,
                       **overrides: Any) -> Path:
    """Write a random-weight HF checkpoint of `family` into `out_dir` and return its path.

    The same (family, seed, overrides) always gives the same weights, whatever `weights_format`
    ("safetensors", or "bin" for a torch-pickled `pytorch_model.bin`) and `max_shard_size`
    (e.g. "100KB": several safetensors files with a `model.safetensors.index.json`).
    """
    import torch

    if family not in FAMILIES:
        raise ValueError(f"family {family!r} is not one of {', '.join(FAMILIES)}")
    if weights_format not in WEIGHTS_FORMATS:
        raise ValueError(f"weights_format {weights_format!r} is not one of {', '.join(WEIGHTS_FORMATS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kwargs = {**_DEFAULTS[family], "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
              "pad_token_id": PAD_ID, **overrides}
    tokenizer_vocab = write_tiny_tokenizer(out, kwargs["vocab_size"], kwargs.get(
        "max_position_embeddings", kwargs.get("n_positions", 256)))
    assert tokenizer_vocab <= kwargs["vocab_size"]

    config_cls, model_cls = _model_classes(family)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).to(torch.float32).eval()
    with torch.no_grad():
        # HF initialises norms to 1 and biases to 0; perturb them so that a converter which
        # drops or misplaces a bias or norm weight changes the output.
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.05)

    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    _save_quietly(model, out, **save_kwargs)
    if weights_format == "bin":
        for f in out.glob("model*.safetensors*"):
            f.unlink()
        torch.save(model.state_dict(), out / "pytorch_model.bin")
    return out


# Where each family's HF checkpoint keeps a layer's attention projections (no `.weight`).
_ATTENTION = {
    "llama": ("model.layers.{i}.self_attn", "q_proj", "k_proj", "v_proj", "o_proj"),
    "qwen2": ("model.layers.{i}.self_attn", "q_proj", "k_proj", "v_proj", "o_proj"),
    "gptj": ("transformer.h.{i}.attn", "q_proj", "k_proj", "v_proj", "out_proj"),
}
KV_SCALE_NAMINGS = ("attention", "projection")  # self_attn.k_scale (compressed-tensors); k_proj.k_scale (ModelOpt)


def add_fp8_kv_scales(hf_dir: str | Path, k_scale: float, v_scale: float, naming: str = "attention") -> Path:
    """Make the tiny checkpoint in `hf_dir` one quantized for an fp8 KV cache, in place: every
    layer's keys come out `k_scale` times larger and its values `v_scale` times larger, with q and
    o divided to match (so the model computes the same function in exact arithmetic), and each
    layer stores the per-tensor `k_scale` and `v_scale` a cache of e4m3 keys and values then needs,
    named as `naming` (KV_SCALE_NAMINGS) says. A single `model.safetensors` of llama, qwen2 or gptj."""
    import torch
    from safetensors.torch import load_file, save_file

    hf_dir = Path(hf_dir)
    family = json.loads((hf_dir / "config.json").read_text())["model_type"]
    path = hf_dir / "model.safetensors"
    if family not in _ATTENTION or not path.is_file():
        raise ValueError(f"add_fp8_kv_scales takes one model.safetensors of {', '.join(_ATTENTION)}; "
                         f"{hf_dir} holds {family}")
    if naming not in KV_SCALE_NAMINGS:
        raise ValueError(f"naming {naming!r} is not one of {', '.join(KV_SCALE_NAMINGS)}")
    attn, q, k, v, o = _ATTENTION[family]
    tensors = load_file(str(path))
    layers = 0
    while any(name.startswith(attn.format(i=layers) + ".") for name in tensors):
        layers += 1
    for i in range(layers):
        at = attn.format(i=i)
        for proj, gain in ((q, 1 / k_scale), (k, k_scale), (v, v_scale)):  # q.k and the softmax unchanged
            for kind in ("weight", "bias"):
                if f"{at}.{proj}.{kind}" in tensors:
                    tensors[f"{at}.{proj}.{kind}"] = tensors[f"{at}.{proj}.{kind}"] * gain
        tensors[f"{at}.{o}.weight"] = tensors[f"{at}.{o}.weight"] / v_scale  # o's input is v_scale times larger
        k_name, v_name = ((f"{at}.k_scale", f"{at}.v_scale") if naming == "attention"
                          else (f"{at}.{k}.k_scale", f"{at}.{v}.v_scale"))
        # 0-dimensional fp32 tensors, as checkpoints store per-tensor scales
        tensors[k_name] = torch.tensor(k_scale, dtype=torch.float32)
        tensors[v_name] = torch.tensor(v_scale, dtype=torch.float32)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return hf_dir


def _save_quietly(model, out: Path, **kwargs: Any) -> None:
    """save_pretrained without its progress bar on stderr (restoring the caller's setting)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, **kwargs)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def write_tiny_tokenizer(out_dir: Path, vocab_size: int, max_length: int = 256) -> int:
    """Train a byte-level BPE on CORPUS up to `vocab_size` tokens; returns the size reached."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    pad, bos, eos = SPECIAL_TOKENS
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "model_max_length": max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return tok.get_vocab_size()


def write_synthetic_tokenizer(out_dir: str | Path, vocab_size: int, max_length: int = 4096) -> Path:
    """A word-level tokenizer of `vocab_size` made-up words (`w0` .. `wN`): for benchmarks on
    random weights of a real model's shape, whose sampled ids must all decode."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(out / "tokenizer.json"))
    pad, bos, eos = SPECIAL_TOKENS
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "pad_token": pad, "model_max_length": max_length}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardline.tiny", description=__doc__.split("\n")[0])
    parser.add_argument("out", help="directory to write the checkpoint into")
    parser.add_argument("--family", default="llama", choices=FAMILIES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weights-format", default="safetensors", choices=WEIGHTS_FORMATS)
    args = parser.parse_args(argv)
    path = make_tiny_hf_model(args.out, args.family, seed=args.seed, weights_format=args.weights_format)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
