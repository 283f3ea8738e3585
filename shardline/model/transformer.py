"""One pipeline stage's share of a decoder-only transformer, on one tensor-parallel rank.

The three families differ only in switches of `ModelConfig` (norm kind, MLP kind, learned or
rotary positions, parallel residual, biases), so this one file runs Llama, Mistral, Qwen2, GPT-J
and GPT-2. It has no parallelism logic beyond the two (GPT-J: one) all-reduces per layer and the
vocab-parallel ends; it never sees a scheduler or a queue: tensors in, tensors out.

Tokens are packed: a step's T tokens from all sequences form one [T, H] matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardline.config import ConfigError, ModelConfig
from shardline.kernels import _dispatch, attention, norm, rotary
from shardline.kernels.argmax import argmax_rows
from shardline.kernels.embedding import embed_rows, resolve_ids
from shardline.kernels.norm import RowNorm
from shardline.kernels.quant import GreedyIds
from shardline.model.layers import Linear, VocabParallelEmbedding
from shardline.parallel import TPGroup


@dataclass
class StepMetadata:
    """Where each packed token sits: everything attention needs, on the model's device."""

    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, cache slot of each token's k/v
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32, tokens in the cache after this step
    query_start_loc: torch.Tensor  # [B + 1] int32
    sample_rows: torch.Tensor  # [S] int64, ascending: rows of T whose next token is drawn (last stage)
    # Host-side hints for kernel choice (never read from the device): 1 = every chunk is a
    # decode token; max_seq_len bounds the split-K of decode attention (None: block-table width).
    max_query_len: int | None = None
    max_seq_len: int | None = None
    # [1] int64 on the device, or None (write them): 0 when no sampled row reads the logits (a
    # decode graph's all-greedy step), so a head that leaves the greedy ids may skip writing them.
    logits_wanted: torch.Tensor | None = None


@dataclass
class PendingIds:
    """A one-stage model's rows whose token the previous step sampled on the device: row r's id
    is sampled[src[r]] where src[r] >= 0, else the host's (cuda_graphs.py, overlap.py)."""

    src: torch.Tensor  # [T] int64
    sampled: torch.Tensor  # [>= max(src) + 1] int64


class Norm:
    def __init__(self, cfg: ModelConfig, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias, self.eps, self.is_rms = weight, bias, cfg.norm_eps, cfg.norm == "rms"

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.is_rms:
            return norm.rms_norm(x, self.weight, self.eps, residual)
        return norm.layer_norm(x, self.weight, self.bias, self.eps, residual)


def fold_norm_weight(w: dict[str, torch.Tensor], norm_name: str, linear_name: str) -> None:
    """RMSNorm(x) * g @ W.T = RMSNorm(x) @ (W * g).T: the norm's weight g goes into the columns of
    the product after it, and the norm keeps a weight of ones. Replaces the two entries of `w`
    (not the tensors, which their other holders keep; the dict stays consistent if reused)."""
    g = w[norm_name]
    if not bool((g == 1).all()):
        w[linear_name] = w[linear_name] * g  # one rounding of the exact product, as in fp32
        w[norm_name] = torch.ones_like(g)


def fold_layer_norm(w: dict[str, torch.Tensor], norm_prefix: str, linear_prefixes: tuple[str, ...]) -> None:
    """LayerNorm(x) = g * x_hat + b before products W: W (g * x_hat + b) = (W * g) x_hat + W b, so
    the norm's weight goes into the columns of each product after it (as fold_norm_weight's) and
    its bias into each product's bias (W b in fp32 from the weight before folding, rounded once),
    and the norm keeps a weight of ones and a bias of zeros. Replaces the entries of `w`, not the
    tensors."""
    g, b = w[f"{norm_prefix}.weight"], w[f"{norm_prefix}.bias"]
    if bool((g == 1).all()) and not bool(b.any()):
        return
    for lin in linear_prefixes:
        weight, bias = w[f"{lin}.weight"], w.get(f"{lin}.bias")
        folded_bias = weight.float() @ b.float() + (0.0 if bias is None else bias.float())
        w[f"{lin}.bias"] = folded_bias.to(weight.dtype)
        w[f"{lin}.weight"] = weight * g
    w[f"{norm_prefix}.weight"], w[f"{norm_prefix}.bias"] = torch.ones_like(g), torch.zeros_like(b)


def kv_scales(w: dict[str, torch.Tensor], prefix: str) -> attention.KVScales:
    """The layer's fp8 KV-cache scales (`{prefix}k_scale` and `v_scale`, from a checkpoint that has
    them: docs/shard-format.md), else 1."""
    k, v = w.get(f"{prefix}k_scale"), w.get(f"{prefix}v_scale")
    if k is None and v is None:
        return attention.NO_SCALES
    if k is None or v is None:
        have, lack = ("v_scale", "k_scale") if k is None else ("k_scale", "v_scale")
        raise ConfigError(f"the shard has {prefix}{have} but no {prefix}{lack}; an fp8 KV cache needs both or "
                          f"neither: re-run `shardline convert`")
    try:
        return attention.KVScales.check(float(k.reshape(-1)[0]), float(v.reshape(-1)[0]), f"layer {prefix}")
    except ValueError as e:
        raise ConfigError(f"{e}; re-convert from a checkpoint with valid scales") from None


def _gemv_norm(n: Norm) -> bool:
    """The decode GEMV runs this norm inside it: RMSNorm without a bias, or LayerNorm with one
    (unless SHARDLINE_GEMV_LAYERNORM=0, the A/B switch)."""
    return n.is_rms and n.bias is None or (_dispatch.GEMV_LAYERNORM and not n.is_rms and n.bias is not None)


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, tp: TPGroup, w: dict[str, torch.Tensor], prefix: str,
                 cos_sin: torch.Tensor | None) -> None:
        # Llama-style layers (RMSNorm without bias, sequential residual, SwiGLU) with weights of
        # the model's dtype fold each norm's weight into the product after it (fold_norm_weight),
        # so that at a batch of decode rows the norm is a row scale in that product's epilogue
        # and the residual add one in the epilogue of the product before (`_decode_folded`).
        self.folded = (cfg.norm == "rms" and not cfg.parallel_residual and cfg.activation == "silu_glu"
                       and f"{prefix}input_norm.bias" not in w and f"{prefix}qkv_proj.weight_scale" not in w)
        if self.folded:
            fold_norm_weight(w, f"{prefix}input_norm.weight", f"{prefix}qkv_proj.weight")
            fold_norm_weight(w, f"{prefix}post_attention_norm.weight", f"{prefix}gate_up_proj.weight")
        # GPT-J-style layers (one LayerNorm with a bias before both qkv and up, a parallel
        # residual, GELU) fold it into both products the same way, its bias into theirs, and at a
        # batch of decode rows centre the rows there too (`_decode_folded_parallel`).
        self.folded_parallel = (cfg.norm == "layer" and cfg.parallel_residual and cfg.activation == "gelu_tanh"
                                and f"{prefix}input_norm.bias" in w
                                and not any(f"{prefix}{lin}.weight_scale" in w for lin in ("qkv_proj", "up_proj")))
        if self.folded_parallel:
            fold_layer_norm(w, f"{prefix}input_norm", (f"{prefix}qkv_proj", f"{prefix}up_proj"))

        def linear(name: str) -> Linear:
            return Linear(w[f"{prefix}{name}.weight"], w.get(f"{prefix}{name}.bias"),
                          w.get(f"{prefix}{name}.weight_scale"))

        self.cfg, self.tp, self.cos_sin = cfg, tp, cos_sin
        self.num_heads = cfg.num_heads // tp.size
        self.num_kv_heads = cfg.num_kv_heads // tp.size
        self.scale = cfg.head_dim ** -0.5
        self.kv_scales = kv_scales(w, prefix)
        self.input_norm = Norm(cfg, w[f"{prefix}input_norm.weight"], w.get(f"{prefix}input_norm.bias"))
        self.post_attention_norm = None
        if not cfg.parallel_residual:
            self.post_attention_norm = Norm(cfg, w[f"{prefix}post_attention_norm.weight"],
                                            w.get(f"{prefix}post_attention_norm.bias"))
        self.qkv_proj, self.o_proj = linear("qkv_proj"), linear("o_proj")
        self.is_glu = cfg.activation == "silu_glu"
        self.up_proj = linear("gate_up_proj" if self.is_glu else "up_proj")
        self.down_proj = linear("down_proj")
        if self.folded_parallel:  # the mean's share of each output: W (x - mean) = W x - mean * W 1
            for lin in (self.qkv_proj, self.up_proj):
                lin.centre = lin.weight.float().sum(1)
        # At one decode row, each norm runs inside the GEMV after it and the activation in the up
        # GEMV's epilogue (`_decode`): RMSNorm without a bias or LayerNorm with one, SwiGLU or GELU.
        # A parallel residual (GPT-J) also has down's GEMV add attention's output, so o must have
        # no bias of its own to add between them.
        self.fuse_decode = (cfg.activation in ("silu_glu", "gelu_tanh") and _gemv_norm(self.input_norm) and (
            _gemv_norm(self.post_attention_norm) if self.post_attention_norm is not None
            else self.o_proj.bias is None))

    def attention(self, x: torch.Tensor, meta: StepMetadata, k_cache: torch.Tensor,
                  v_cache: torch.Tensor) -> torch.Tensor:
        """Partial (pre-all-reduce, bias-free) attention output [T, H]."""
        return self._attend(self.qkv_proj(x), meta, k_cache, v_cache)

    def _attend(self, qkv: torch.Tensor, meta: StepMetadata, k_cache: torch.Tensor,
                v_cache: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """From the qkv projection [T, (nh + 2 nkv) hd] of this rank's heads to the partial output
        (with `bias` added in o's epilogue: another product's, which the caller sums with it)."""
        return self.o_proj(self._heads(qkv, meta, k_cache, v_cache), add_bias=False, bias=bias)

    def _heads(self, qkv: torch.Tensor, meta: StepMetadata, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor:
        """The attention of this rank's heads [T, nh * hd], before the o projection."""
        T, hd = qkv.shape[0], self.cfg.head_dim
        q_size, kv_size = self.num_heads * hd, self.num_kv_heads * hd
        q = qkv[:, :q_size].view(T, self.num_heads, hd)
        k = qkv[:, q_size:q_size + kv_size].view(T, self.num_kv_heads, hd)
        v = qkv[:, q_size + kv_size:].view(T, self.num_kv_heads, hd)
        if self.cos_sin is not None and meta.max_query_len == 1:  # decode: rotary, cache write, attention
            o = attention.rotary_decode_attention(q, k, v, meta.positions, self.cos_sin, self.cfg.rotary_dim,
                                                  k_cache, v_cache, meta.slot_mapping, meta.block_tables,
                                                  meta.seq_lens, meta.query_start_loc, self.scale,
                                                  max_seq_len=meta.max_seq_len, kv_scales=self.kv_scales)
        else:
            if self.cos_sin is not None:  # rotary fused with the cache write: rotated k goes straight there
                q = rotary.apply_rotary_and_write_kv(q, k, v, meta.positions, self.cos_sin, self.cfg.rotary_dim,
                                                     k_cache, v_cache, meta.slot_mapping, self.kv_scales)
            else:
                attention.write_kv(k, v, k_cache, v_cache, meta.slot_mapping, self.kv_scales)
            o = attention.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                          meta.query_start_loc, self.scale, max_query_len=meta.max_query_len,
                                          max_seq_len=meta.max_seq_len, kv_scales=self.kv_scales)  # (T, nh, hd)
        return o.reshape(T, q_size)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """Partial (pre-all-reduce, bias-free) MLP output [T, H]."""
        return self.down_proj(self._activation(x), add_bias=False)

    def _activation(self, x: torch.Tensor) -> torch.Tensor:
        """The up projection and its activation (SwiGLU, GELU): in its epilogue where its kernel can."""
        return self.up_proj.glu(x) if self.is_glu else self.up_proj.gelu(x)

    def _decode(self, h: torch.Tensor, residual: torch.Tensor | None, meta: StepMetadata,
                k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same layer for one row (batch-1 decode) as GEMV kernels, each norm fused into the
        product after it and the activation (SwiGLU, GELU) into the up product (shardline/kernels/gemv.py).
        With a parallel residual (GPT-J) qkv and up both read the input norm, and down's GEMV adds
        attention's partial output (and on one rank its own bias): no add kernels. Taken when the
        qkv projection runs the GEMV (`Linear.uses_gemv`: by default, or as `tune-gemm` chose);
        the fused products then go with it."""
        n1, n2 = self.input_norm, self.post_attention_norm
        activation_kw = dict(glu=self.is_glu, gelu=not self.is_glu)
        qkv, new_residual = self.qkv_proj.fused(h, n1.weight, n1.eps, residual, norm_bias=n1.bias)
        residual = h if residual is None else new_residual
        if n2 is None:
            act, _ = self.up_proj.fused(residual, n1.weight, n1.eps, norm_bias=n1.bias, **activation_kw)
            one_rank = self.tp.size == 1
            out, _ = self.down_proj.fused(act, add=self._attend(qkv, meta, k_cache, v_cache), add_bias=one_rank)
            return self._reduce(out, None if one_rank else self.down_proj.bias), residual
        attn = self._reduce(self._attend(qkv, meta, k_cache, v_cache), self.o_proj.bias)
        act, residual = self.up_proj.fused(attn, n2.weight, n2.eps, residual, norm_bias=n2.bias, **activation_kw)
        return self._reduce(self.down_proj(act, add_bias=False), self.down_proj.bias), residual

    def folds(self, h: torch.Tensor) -> bool:
        """This layer runs `_decode_folded` (`_decode_folded_parallel`) at h's rows: its weights
        hold the norms' (one rank: the residual adds need the whole sums, which TP's all-reduces
        would split) and every product chosen for these rows takes the fold in its epilogue."""
        return (_dispatch.FOLD_NORMS and (self.folded or self.folded_parallel) and self.tp.size == 1
                and all(lin.folds(h) for lin in (self.qkv_proj, self.o_proj, self.up_proj, self.down_proj)))

    def _folded_qkv(self, h: torch.Tensor, residual: torch.Tensor | RowNorm | None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(the stream, qkv, the normed rows or None): qkv folded over the RowNorm the layer
        before left, else after the input norm's kernel (the first layer, or after a layer that
        did not fold), whose normed rows the caller may need again."""
        if isinstance(residual, RowNorm):
            return h, self.qkv_proj.fold(h, norm=residual), None
        x, summed = self.input_norm(h, residual)
        return (h if residual is None else summed), self.qkv_proj(x), x

    def _decode_folded(self, h: torch.Tensor, residual: torch.Tensor | RowNorm | None, meta: StepMetadata,
                       k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, RowNorm]:
        """The layer with no norm kernel: each product before a norm adds the residual in its
        epilogue and leaves the stream's sums of squares; each product after one scales its rows
        by 1 / rms in its epilogue, the norm's weight folded into its own. The layer takes the
        whole stream with its RowNorm from the layer before (else runs the input norm's kernel:
        the first layer, or after a layer that did not fold) and returns the same."""
        stream, qkv, _ = self._folded_qkv(h, residual)
        stream, sum_squares = self.o_proj.fold(self._heads(qkv, meta, k_cache, v_cache), residual=stream)
        act = self.up_proj.fold(stream, norm=RowNorm(sum_squares, self.post_attention_norm.eps), glu=True)
        stream, sum_squares = self.down_proj.fold(act, residual=stream)
        return stream, RowNorm(sum_squares, self.input_norm.eps)

    def _decode_folded_parallel(self, h: torch.Tensor, residual: torch.Tensor | RowNorm | None,
                                meta: StepMetadata, k_cache: torch.Tensor,
                                v_cache: torch.Tensor) -> tuple[torch.Tensor, RowNorm]:
        """GPT-J's layer with no norm kernel: qkv and up read the stream itself and centre and
        scale its rows in their epilogues (the LayerNorm's mean and 1 / std from the sums and
        squares the layer before left); o adds the stream to attention's output in its epilogue,
        and down that to its own (and its bias), leaving the next stream's sums and squares. The
        first layer (no RowNorm) runs the norm's kernel and the plain products."""
        stream, qkv, x = self._folded_qkv(h, residual)
        stream_attn, _ = self.o_proj.fold(self._heads(qkv, meta, k_cache, v_cache), residual=stream)
        act = self.up_proj.fold(h, norm=residual, gelu=True) if x is None else self.up_proj.gelu(x)
        stream, partials = self.down_proj.fold(act, residual=stream_attn, sums=True)
        return stream, RowNorm.of(partials, self.input_norm.eps)

    def _reduce(self, partial: torch.Tensor, *biases: torch.Tensor | None) -> torch.Tensor:
        out = self.tp.all_reduce(partial)
        for b in biases:
            if b is not None:
                out = out + b
        return out

    def __call__(self, h: torch.Tensor, residual: torch.Tensor | RowNorm | None, meta: StepMetadata,
                 k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | RowNorm]:
        """(h, residual) -> (h', residual'): the stream is h + residual; norms fuse the add. A
        RowNorm for residual: h is the whole stream, and these are its rows' statistics."""
        if self.folds(h):
            fold = self._decode_folded_parallel if self.folded_parallel else self._decode_folded
            return fold(h, residual, meta, k_cache, v_cache)
        if isinstance(residual, RowNorm):
            residual = None
        if self.fuse_decode and self.qkv_proj.uses_gemv(h):
            return self._decode(h, residual, meta, k_cache, v_cache)
        x, residual = self.input_norm(h, residual)
        if residual is None:
            residual = h
        if self.post_attention_norm is None:
            # Parallel residual (GPT-J): attention and MLP read the same normed input, so their
            # partial sums share one all-reduce instead of two. On one rank, where down's kernel
            # takes the residual add, it adds attention's output and its own bias in its epilogue.
            # Elsewhere down accumulates onto attention's output (cuBLAS's beta = 1) and, on one
            # rank, o's product carries down's bias: no add kernel either way.
            carry = self.tp.size == 1 and self.o_proj.bias is None
            if carry and self.down_proj.folds(x):
                attn, act = self.attention(x, meta, k_cache, v_cache), self._activation(x)
                return self.down_proj.fold(act, residual=attn)[0], residual
            attn = self._attend(self.qkv_proj(x), meta, k_cache, v_cache, bias=self.down_proj.bias if carry else None)
            partial = self.down_proj.accumulate(self._activation(x), onto=attn)
            return self._reduce(partial, self.o_proj.bias, None if carry else self.down_proj.bias), residual
        attn = self._reduce(self.attention(x, meta, k_cache, v_cache), self.o_proj.bias)
        x, residual = self.post_attention_norm(attn, residual)
        return self._reduce(self.mlp(x), self.down_proj.bias), residual


class StageModel:
    """Layers [layer_start, layer_end) plus the embedding (first stage) or the head (last stage)."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup, weights: dict[str, torch.Tensor],
                 layer_start: int, layer_end: int, is_first: bool, is_last: bool) -> None:
        self.cfg, self.tp = cfg, tp
        self.is_first, self.is_last = is_first, is_last
        self.layer_start, self.layer_end = layer_start, layer_end
        some = next(iter(weights.values()))
        self.device = some.device
        self.dtype = weights[f"layers.{layer_start}.input_norm.weight"].dtype
        cos_sin = None
        if cfg.position == "rotary":
            cos_sin = rotary.rotary_cos_sin(cfg.max_position_embeddings, cfg.rotary_dim,
                                            cfg.rope_theta, cfg.rope_scaling, self.device)
        self.layers = [DecoderLayer(cfg, tp, weights, f"layers.{i}.", cos_sin)
                       for i in range(layer_start, layer_end)]
        if is_first:
            self.embed_tokens = VocabParallelEmbedding(weights["embed_tokens.weight"], tp)
            self.embed_positions = weights.get("embed_positions.weight")
        if is_last:
            # The final norm folds into the head as each layer's into its products, so that a
            # decode step of folded layers ends in the head's kernel with no norm kernel before it.
            # Not with a head tied to the embedding, which the weight must stay.
            tied = is_first and weights["lm_head.weight"].data_ptr() == weights["embed_tokens.weight"].data_ptr()
            self.head_folded = bool(self.layers and self.layers[-1].folded and "lm_head.weight_scale" not in weights
                                    and not tied)
            if self.head_folded:
                fold_norm_weight(weights, "norm.weight", "lm_head.weight")
            self.norm = Norm(cfg, weights["norm.weight"], weights.get("norm.bias"))
            self.lm_head = Linear(weights["lm_head.weight"], weights.get("lm_head.bias"))

    def linears(self) -> list[Linear]:
        out = [lin for layer in self.layers
               for lin in (layer.qkv_proj, layer.o_proj, layer.up_proj, layer.down_proj)]
        return out + ([self.lm_head] if self.is_last else [])

    def configure_gemms(self, table) -> None:
        """Use the per-shape, per-batch-size choices of `shardline tune-gemm` (a GemmTable)."""
        for lin in self.linears():
            lin.gemms = table
        for layer in self.layers:  # the 12-bit form runs a layer's products (kernels/gluon_exp12.py), not the head
            for lin in (layer.qkv_proj, layer.o_proj, layer.up_proj, layer.down_proj):
                lin.prepare_exp12(glu=layer.is_glu and lin is layer.up_proj)
        if self.is_last:
            self.lm_head.prepare_exp12(glu=False, allowed=False)

    def gemm_bucket_gaps(self, table) -> dict[str, list[int]]:
        """The batch buckets each projection lacks in `table` that another has (gemm_tuning.bucket_gaps)."""
        from shardline.gemm_tuning import bucket_gaps, key
        if not self.layers:
            return {}
        layer = self.layers[0]
        return bucket_gaps(table, {name: key(*lin.weight.shape, lin.weight.dtype, self.dtype) for name, lin in
                                   (("qkv_proj", layer.qkv_proj), ("o_proj", layer.o_proj),
                                    ("up_proj", layer.up_proj), ("down_proj", layer.down_proj))})

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor, pending: PendingIds | None = None
              ) -> tuple[torch.Tensor, RowNorm | None]:
        """The stream [T, H] of the step's tokens, and on one rank of folded layers its rows'
        RowNorm, which the first layer's qkv product takes as every later one takes its own: one
        kernel (shardline/kernels/embedding.py) resolves the pending ids, copies the rows and sums their
        squares."""
        first = self.layers[0] if self.layers else None
        if self.tp.size == 1 and self.embed_positions is None:
            fold = first is not None and first.folded and _dispatch.FOLD_NORMS
            x, ss = embed_rows(input_ids, self.embed_tokens.weight, pending and pending.src,
                               pending and pending.sampled, sum_squares=fold)
            return x, (RowNorm(ss, first.input_norm.eps) if fold else None)
        if pending is not None:
            input_ids = resolve_ids(input_ids, pending.src, pending.sampled)
        x = self.embed_tokens(input_ids)  # (T, H)
        if self.embed_positions is not None:
            x = x + self.embed_positions[positions]
        return x, None

    def forward(self, inputs: torch.Tensor, meta: StepMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], pending: PendingIds | None = None,
                greedy: torch.Tensor | None = None) -> torch.Tensor:
        """inputs: token ids [T] (first stage; `pending` names those the previous step sampled on
        the device) or the hidden stream [T, H] from the previous stage.

        Returns the hidden stream [T, H] for the next stage, or, on the last stage, the full-vocab
        logits [S, V] (fp32) of the rows in meta.sample_rows; with `greedy` (int64 [S]), each of
        those rows' argmax is written there too (by the head's kernel where it can, which then
        leaves the logits unwritten where meta.logits_wanted holds 0).
        """
        h, residual = self.embed(inputs, meta.positions, pending) if self.is_first else (inputs.to(self.dtype), None)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            h, residual = layer(h, residual, meta, k_cache, v_cache)
        every_row = meta.sample_rows.shape[0] == h.shape[0]  # ascending, so they are 0..T-1
        if isinstance(residual, RowNorm):  # the folded layers leave the whole stream in h
            if self.is_last and self.head_folded and self.tp.size == 1 and every_row and self.lm_head.folds(h):
                ids = None if greedy is None else GreedyIds(greedy, self.cfg.vocab_size, meta.logits_wanted)
                return self._logits(self.lm_head.fold(h, norm=residual, out_dtype=torch.float32, greedy=ids))
            residual = None
        if not self.is_last:
            return h if residual is None else h + residual
        if not every_row:  # only the rows whose next token is drawn
            rows = meta.sample_rows
            h, residual = h[rows], (None if residual is None else residual[rows])
        if _gemv_norm(self.norm) and self.lm_head.uses_gemv(h):
            logits = self.lm_head.fused(h, self.norm.weight, self.norm.eps, residual, norm_bias=self.norm.bias)[0]
        else:
            x = self.norm(h, residual)[0]
            if greedy is not None and self.tp.size == 1 and self.lm_head.folds(x):
                # The ids from the product's epilogue, as on the folded path, with no norm to fold.
                ids = GreedyIds(greedy, self.cfg.vocab_size, meta.logits_wanted)
                return self._logits(self.lm_head.fold(x, out_dtype=torch.float32, greedy=ids))
            logits = self.lm_head(x, out_dtype=torch.float32)
        logits = self._logits(logits)
        if greedy is not None:
            argmax_rows(logits, out=greedy)
        return logits

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        logits = self.tp.all_gather_last_dim(logits.float())  # (S, Vp)
        return logits[:, :self.cfg.vocab_size]
