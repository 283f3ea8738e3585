"""Where each HuggingFace family keeps its weights, and the shard plan built from that.

`plan_shard` is the code form of the table in docs/shard-format.md: for one (stage, rank) it
lists every output tensor, in file order, as slices of the checkpoint's tensors. The three
families differ only in their `HFNames` (and GPT-J's rotary permutation); the split rules are
shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardline.config import ModelConfig
from shardline.converter.plan import OutTensor, Piece, cols, rows, whole


@dataclass(frozen=True)
class HFNames:
    """HF tensor names; `{i}` is the layer index. Norm and linear names lack `.weight`/`.bias`."""

    embed: str
    positions: str | None  # learned position embedding (GPT-2)
    final_norm: str
    lm_head: str
    input_norm: str
    post_attention_norm: str | None  # None: parallel residual, one norm per layer (GPT-J)
    q: str  # for a fused qkv (GPT-2), q, k and v name the same tensor
    k: str
    v: str
    o: str
    gate: str | None  # None: GELU MLP with one up projection
    up: str
    down: str
    conv1d: bool = False  # linears stored [in, out] (GPT-2 Conv1D)
    interleaved_rotary: bool = False  # rotary pairs (2j, 2j+1) in q/k rows (GPT-J)

    @property
    def fused_qkv(self) -> bool:
        return self.q == self.k == self.v


FAMILY_NAMES = {
    "llama": HFNames(
        embed="model.embed_tokens", positions=None, final_norm="model.norm", lm_head="lm_head",
        input_norm="model.layers.{i}.input_layernorm",
        post_attention_norm="model.layers.{i}.post_attention_layernorm",
        q="model.layers.{i}.self_attn.q_proj", k="model.layers.{i}.self_attn.k_proj",
        v="model.layers.{i}.self_attn.v_proj", o="model.layers.{i}.self_attn.o_proj",
        gate="model.layers.{i}.mlp.gate_proj", up="model.layers.{i}.mlp.up_proj",
        down="model.layers.{i}.mlp.down_proj"),
    "gptj": HFNames(
        embed="transformer.wte", positions=None, final_norm="transformer.ln_f", lm_head="lm_head",
        input_norm="transformer.h.{i}.ln_1", post_attention_norm=None,
        q="transformer.h.{i}.attn.q_proj", k="transformer.h.{i}.attn.k_proj",
        v="transformer.h.{i}.attn.v_proj", o="transformer.h.{i}.attn.out_proj",
        gate=None, up="transformer.h.{i}.mlp.fc_in", down="transformer.h.{i}.mlp.fc_out",
        interleaved_rotary=True),
    "gpt2": HFNames(
        embed="transformer.wte", positions="transformer.wpe", final_norm="transformer.ln_f",
        lm_head="lm_head", input_norm="transformer.h.{i}.ln_1",
        post_attention_norm="transformer.h.{i}.ln_2",
        q="transformer.h.{i}.attn.c_attn", k="transformer.h.{i}.attn.c_attn",
        v="transformer.h.{i}.attn.c_attn", o="transformer.h.{i}.attn.c_proj",
        gate=None, up="transformer.h.{i}.mlp.c_fc", down="transformer.h.{i}.mlp.c_proj", conv1d=True),
}


def kv_scale_candidates(names: HFNames, i: int) -> list[tuple[str, str]]:
    """Where checkpoints quantized for an fp8 KV cache keep layer i's k and v scales, most common
    first: on the attention module (compressed-tensors), on k_proj and v_proj (ModelOpt; older
    compressed-tensors as `output_scale`), or one `kv_scale` for both (older still)."""
    k, v = names.k.format(i=i), names.v.format(i=i)
    attn = k.rsplit(".", 1)[0]
    return [(f"{attn}.k_scale", f"{attn}.v_scale"), (f"{k}.k_scale", f"{v}.v_scale"),
            (f"{k}.output_scale", f"{v}.output_scale"), (f"{attn}.kv_scale", f"{attn}.kv_scale")]


def rotate_half_order(head_dim: int, rotary_dim: int) -> list[int]:
    """Row order taking one GPT-J head (interleaved rotary pairs) to rotate-half layout."""
    return [*range(0, rotary_dim, 2), *range(1, rotary_dim, 2), *range(rotary_dim, head_dim)]


def plan_shard(cfg: ModelConfig, layers: tuple[int, int], tp: int, rank: int,
               kv_scales: dict[int, tuple[str, str]] | None = None) -> list[OutTensor]:
    """Output tensors of the shard holding global layers `[layers)` on tensor-parallel `rank`;
    `kv_scales`: each layer's (k, v) scale sources, where the checkpoint has them (every rank
    gets the same per-tensor values, as fp32 `layers.{i}.k_scale` and `v_scale`)."""
    names = FAMILY_NAMES[cfg.architecture]
    first, last = layers[0] == 0, layers[1] == cfg.num_layers
    plan: list[OutTensor] = []
    if first:
        plan += _vocab_parallel("embed_tokens", names.embed, cfg, tp, rank, bias=False)
        if names.positions:
            plan.append(OutTensor("embed_positions.weight", (
                whole(names.positions + ".weight", (cfg.max_position_embeddings, cfg.hidden_size)),)))
    for i in range(*layers):
        plan += _layer(cfg, names, i, tp, rank)
        if kv_scales:
            plan += [OutTensor(f"layers.{i}.{kind}_scale", (Piece(source, (1,), scalar=True),), dtype=torch.float32)
                     for kind, source in zip("kv", kv_scales[i])]
    if last:
        plan += _norm("norm", names.final_norm, cfg)
        head = names.embed if cfg.tie_word_embeddings else names.lm_head
        plan += _vocab_parallel("lm_head", head, cfg, tp, rank, bias=False)
        if cfg.lm_head_bias:
            plan += _vocab_parallel("lm_head", names.lm_head, cfg, tp, rank, bias=True)
    return plan


def _norm(name: str, source: str, cfg: ModelConfig) -> list[OutTensor]:
    H = cfg.hidden_size
    out = [OutTensor(f"{name}.weight", (whole(source + ".weight", (H,)),))]
    if cfg.norm == "layer":
        out.append(OutTensor(f"{name}.bias", (whole(source + ".bias", (H,)),)))
    return out


def _vocab_parallel(name: str, source: str, cfg: ModelConfig, tp: int, rank: int, bias: bool) -> list[OutTensor]:
    """Rank's slice `[r*Vp/t, (r+1)*Vp/t)` of the vocab rows; rows past V are zero."""
    V = cfg.vocab_size
    per_rank = cfg.padded_vocab_size(tp) // tp
    start, stop = rank * per_rank, (rank + 1) * per_rank
    shape = (V,) if bias else (V, cfg.hidden_size)
    piece = Piece(source + (".bias" if bias else ".weight"), shape,
                  rows=(min(start, V), min(stop, V)), pad_rows=stop - min(stop, V))
    return [OutTensor(f"{name}.{'bias' if bias else 'weight'}", (piece,))]


def _layer(cfg: ModelConfig, names: HFNames, i: int, tp: int, rank: int) -> list[OutTensor]:
    H, hd, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_size, kv_size = cfg.q_size, cfg.kv_size
    nq, nkv, mlp = cfg.num_heads // tp, cfg.num_kv_heads // tp, I // tp
    q_rows = (rank * nq * hd, (rank + 1) * nq * hd)
    kv_rows = (rank * nkv * hd, (rank + 1) * nkv * hd)
    mlp_rows = (rank * mlp, (rank + 1) * mlp)
    conv1d = names.conv1d
    prefix = f"layers.{i}."

    def n(template: str) -> str:
        return template.format(i=i)

    # q, k, v: (source, row offset of this projection inside it, source rows, rank's rows).
    if names.fused_qkv:
        total = q_size + 2 * kv_size
        qkv = [(n(names.q), 0, total, q_rows), (n(names.k), q_size, total, kv_rows),
               (n(names.v), q_size + kv_size, total, kv_rows)]
    else:
        qkv = [(n(names.q), 0, q_size, q_rows), (n(names.k), 0, kv_size, kv_rows),
               (n(names.v), 0, kv_size, kv_rows)]
    # GPT-J rotates interleaved pairs; reorder q and k rows per head to rotate-half layout.
    permute = names.interleaved_rotary and cfg.rotary_dim > 0
    head_order = rotate_half_order(hd, cfg.rotary_dim)

    def qkv_pieces(suffix: str) -> tuple[Piece, ...]:
        pieces = []
        for j, (source, offset, total, (a, b)) in enumerate(qkv):
            shape = (total, H) if suffix == ".weight" else (total,)
            order = None
            if permute and j < 2:
                order = tuple(h * hd + d for h in range((b - a) // hd) for d in head_order)
            pieces.append(Piece(source + suffix, shape, rows=(offset + a, offset + b),
                                conv1d=conv1d and suffix == ".weight", row_order=order))
        return tuple(pieces)

    plan = _norm(prefix + "input_norm", n(names.input_norm), cfg)
    plan.append(OutTensor(prefix + "qkv_proj.weight", qkv_pieces(".weight")))
    if cfg.qkv_bias:
        plan.append(OutTensor(prefix + "qkv_proj.bias", qkv_pieces(".bias")))
    o_weight = cols(n(names.o) + ".weight", (H, q_size), *q_rows, conv1d)
    plan.append(OutTensor(prefix + "o_proj.weight", (o_weight,)))
    if cfg.o_bias:
        plan.append(OutTensor(prefix + "o_proj.bias", (whole(n(names.o) + ".bias", (H,)),)))
    if names.post_attention_norm:
        plan += _norm(prefix + "post_attention_norm", n(names.post_attention_norm), cfg)

    up = "gate_up_proj" if names.gate else "up_proj"
    sources = [n(names.gate), n(names.up)] if names.gate else [n(names.up)]
    plan.append(OutTensor(f"{prefix}{up}.weight",
                          tuple(rows(s + ".weight", (I, H), *mlp_rows, conv1d) for s in sources)))
    if cfg.mlp_bias:
        plan.append(OutTensor(f"{prefix}{up}.bias", tuple(rows(s + ".bias", (I,), *mlp_rows) for s in sources)))
    down_weight = cols(n(names.down) + ".weight", (H, I), *mlp_rows, conv1d)
    plan.append(OutTensor(prefix + "down_proj.weight", (down_weight,)))
    if cfg.mlp_bias:
        plan.append(OutTensor(prefix + "down_proj.bias", (whole(n(names.down) + ".bias", (H,)),)))
    return plan
