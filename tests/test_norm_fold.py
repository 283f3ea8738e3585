"""The norm folds (model/transformer.py): each Llama-style layer's RMSNorm weights, and each
GPT-J-style layer's LayerNorm weight and bias, go into the products after them, and at decode
batches the norms become row factors (and a LayerNorm's centring) and residual adds in the
products' epilogues. On the CPU the products' references compute the fold, so the layer's
arithmetic is checked here against the plain path on the same weights; the kernels' epilogues
are checked against the same references on the GPU (tests/kernels)."""

from __future__ import annotations

import torch

from shardline.config import ModelConfig
from shardline.kernels.norm import RowNorm
from shardline.model import transformer
from shardline.model.random_weights import LLAMA_SMALL, random_manifest, random_stage_weights
from shardline.model.transformer import DecoderLayer, StageModel, StepMetadata, fold_norm_weight
from shardline.parallel import single_rank


def test_fold_norm_weight_moves_the_weight_into_the_columns_once():
    w = {"n.weight": torch.tensor([1.0, 2.0, 0.5]), "l.weight": torch.ones(4, 3)}
    original = w["l.weight"]
    fold_norm_weight(w, "n.weight", "l.weight")
    assert torch.equal(w["l.weight"], torch.tensor([[1.0, 2.0, 0.5]] * 4)) and torch.equal(w["n.weight"], torch.ones(3))
    assert torch.equal(original, torch.ones(4, 3)), "the caller's tensor is left alone"
    fold_norm_weight(w, "n.weight", "l.weight")  # a dict reused for a second model: nothing more to fold
    assert torch.equal(w["l.weight"], torch.tensor([[1.0, 2.0, 0.5]] * 4))


def _model() -> tuple[StageModel, ModelConfig]:
    cfg = ModelConfig(**LLAMA_SMALL)
    weights = random_stage_weights(random_manifest(cfg, "fp32"), 0, 0, "cpu", seed=3)
    gen = torch.Generator().manual_seed(5)
    for name in list(weights):
        if "norm" in name:  # away from 1, so that the fold matters
            weights[name] = torch.rand(weights[name].shape, generator=gen) + 0.5
    return StageModel(cfg, single_rank(), weights, 0, cfg.num_layers, True, True), cfg


def _decode_step(cfg: ModelConfig, rows: int, context: int, block_size: int = 16):
    blocks = -(-context // block_size)
    caches = [(torch.randn(rows * blocks, block_size, cfg.num_kv_heads, cfg.head_dim) * 0.1,
               torch.randn(rows * blocks, block_size, cfg.num_kv_heads, cfg.head_dim) * 0.1)
              for _ in range(cfg.num_layers)]
    tables = torch.arange(rows * blocks, dtype=torch.int32).view(rows, blocks)
    positions = torch.full((rows,), context - 1, dtype=torch.int64)
    slots = tables[:, -1].long() * block_size + (context - 1) % block_size
    meta = StepMetadata(positions=positions, slot_mapping=slots, block_tables=tables,
                        seq_lens=torch.full((rows,), context, dtype=torch.int32),
                        query_start_loc=torch.arange(rows + 1, dtype=torch.int32),
                        sample_rows=torch.arange(rows), max_query_len=1, max_seq_len=context)
    return torch.randint(0, cfg.vocab_size, (rows,)), meta, caches


def test_folded_decode_step_matches_the_plain_path(monkeypatch):
    """A decode step of 6 rows through the folded layers (the embedding's RowNorm into the first,
    the stream and its RowNorm passed from layer to layer, the last one's into the head) runs no
    norm kernel and gives the logits of the plain path (norm kernels, then the products) on the
    same folded weights, and of the weights before folding."""
    model, cfg = _model()
    assert all(layer.folded for layer in model.layers) and model.head_folded
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))
    ids, meta, caches = _decode_step(cfg, 6, 40)
    seen, norms = [], []
    real = DecoderLayer._decode_folded

    def spy(self, h, residual, *args):
        seen.append(residual)
        return real(self, h, residual, *args)
    monkeypatch.setattr(DecoderLayer, "_decode_folded", spy)
    real_norm = transformer.Norm.__call__
    monkeypatch.setattr(transformer.Norm, "__call__", lambda self, *a: norms.append(self) or real_norm(self, *a))
    greedy = torch.full((8,), -1, dtype=torch.int64)
    with torch.inference_mode():
        folded = model.forward(ids, meta, [(k.clone(), v.clone()) for k, v in caches], greedy=greedy[:6])
    assert len(seen) == cfg.num_layers and all(isinstance(r, RowNorm) for r in seen)
    assert norms == [], "the first layer's and the final norm fold too"
    assert greedy.tolist() == folded.argmax(-1).tolist() + [-1, -1], "the head leaves the greedy ids"
    unfolded = _assert_plain_and_unfolded_match(monkeypatch, folded, model, _model, "fold_norm_weight", ids, meta,
                                                caches, greedy=greedy[:6])
    assert norms and greedy[:6].tolist() == folded.argmax(-1).tolist()
    assert not any(torch.equal(l.input_norm.weight, torch.ones_like(l.input_norm.weight)) for l in unfolded.layers)


def _assert_plain_and_unfolded_match(monkeypatch, folded, model, make, fold_name, ids, meta, caches, **forward_kw):
    """`folded`, the step's logits through the folded layers, are those of the plain path (norm
    kernels, then the products) on the same weights and of a model made with `fold_name` (the
    load's fold of the norms into the weights) left out; returns that model."""
    monkeypatch.setattr(DecoderLayer, "folds", lambda self, h: False)
    with torch.inference_mode():
        plain = model.forward(ids, meta, [(k.clone(), v.clone()) for k, v in caches], **forward_kw)
    torch.testing.assert_close(folded, plain, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(transformer, fold_name, lambda *a: None)
    unfolded, _ = make()
    with torch.inference_mode():
        before = unfolded.forward(ids, meta, [(k.clone(), v.clone()) for k, v in caches])
    torch.testing.assert_close(before, plain, rtol=1e-4, atol=1e-4)
    return unfolded


def test_the_switch_keeps_the_norm_kernels(monkeypatch):
    """SHARDLINE_FOLD_NORMS=0 (read into _dispatch.FOLD_NORMS): the layers keep their norm kernels
    on folded weights, for an A/B."""
    from shardline.kernels import _dispatch
    model, cfg = _model()
    h = torch.randn(4, cfg.hidden_size)
    assert model.layers[0].folds(h)
    monkeypatch.setattr(_dispatch, "FOLD_NORMS", False)
    assert not model.layers[0].folds(h) and model.layers[0].folded


def test_a_head_tied_to_the_embedding_keeps_the_final_norm():
    cfg = ModelConfig(**LLAMA_SMALL)
    weights = random_stage_weights(random_manifest(cfg, "fp32"), 0, 0, "cpu", seed=3)
    weights["lm_head.weight"] = weights["embed_tokens.weight"]
    weights["norm.weight"] = torch.rand(cfg.hidden_size) + 0.5
    model = StageModel(cfg, single_rank(), weights, 0, cfg.num_layers, True, True)
    assert not model.head_folded and model.lm_head.weight is model.embed_tokens.weight
    ids, meta, caches = _decode_step(cfg, 3, 20)
    with torch.inference_mode():
        logits = model.forward(ids, meta, caches)
    assert logits.shape == (3, cfg.vocab_size) and torch.isfinite(logits).all()


def test_rows_that_do_not_all_sample_take_the_plain_head(monkeypatch):
    """A step whose sampled rows are not all of its rows gathers them and runs the final norm:
    the logits of those rows are the ones a step sampling every row gives."""
    model, cfg = _model()
    ids, meta, caches = _decode_step(cfg, 5, 30)
    with torch.inference_mode():
        every = model.forward(ids, meta, [(k.clone(), v.clone()) for k, v in caches])
        meta.sample_rows = torch.tensor([1, 3])
        some = model.forward(ids, meta, [(k.clone(), v.clone()) for k, v in caches])
    torch.testing.assert_close(some, every[[1, 3]], rtol=1e-4, atol=1e-4)


def _gptj() -> tuple[StageModel, ModelConfig]:
    from shardline.model.random_weights import GPTJ_SMALL
    cfg = ModelConfig(**GPTJ_SMALL)
    weights = random_stage_weights(random_manifest(cfg, "fp32"), 0, 0, "cpu", seed=4)
    gen = torch.Generator().manual_seed(6)
    for name in list(weights):
        if "norm.weight" in name:  # away from 1 and 0, so that the fold matters
            weights[name] = torch.rand(weights[name].shape, generator=gen) + 0.5
        elif "norm.bias" in name:
            weights[name] = torch.randn(weights[name].shape, generator=gen) * 0.3
    return StageModel(cfg, single_rank(), weights, 0, cfg.num_layers, True, True), cfg


def test_fold_layer_norm_moves_weight_and_bias_into_the_products():
    """W (g * x_hat + b) + c = (W * g) x_hat + (W b + c): the norm keeps ones and zeros."""
    w = {"n.weight": torch.tensor([1.0, 2.0, 0.5]), "n.bias": torch.tensor([0.5, -1.0, 2.0]),
         "a.weight": torch.ones(2, 3), "b.weight": torch.eye(3), "b.bias": torch.tensor([1.0, 0.0, 0.0])}
    x_hat = torch.tensor([0.3, -0.7, 1.1])
    normed = x_hat * w["n.weight"] + w["n.bias"]
    want = {lin: torch.nn.functional.linear(normed, w[f"{lin}.weight"], w.get(f"{lin}.bias"))
            for lin in ("a", "b")}
    transformer.fold_layer_norm(w, "n", ("a", "b"))
    assert torch.equal(w["n.weight"], torch.ones(3)) and torch.equal(w["n.bias"], torch.zeros(3))
    for lin in ("a", "b"):
        torch.testing.assert_close(torch.nn.functional.linear(x_hat, w[f"{lin}.weight"], w[f"{lin}.bias"]), want[lin])
    before = dict(w)
    transformer.fold_layer_norm(w, "n", ("a", "b"))  # folded already: nothing more
    assert all(w[k] is before[k] for k in w)


def test_gptj_folded_decode_step_matches_the_plain_path(monkeypatch):
    """GPT-J's decode rows through the folded layers: after the first layer (whose norm kernel
    runs: the embedding leaves no sums), each layer takes the stream and its LayerNorm's sums and
    squares from the one before, its qkv and up products centre and scale the rows, o and down
    add the residual; no other norm kernel runs but the final one. The logits are the plain
    path's on the same folded weights, and those of the weights before folding."""
    model, cfg = _gptj()
    layers = model.layers
    assert all(layer.folded_parallel and not layer.folded for layer in layers) and not model.head_folded
    assert all(torch.equal(l.input_norm.bias, torch.zeros_like(l.input_norm.bias)) for l in layers)
    ids, meta, caches = _decode_step(cfg, 5, 24)
    norms, folds = [], []
    real_norm, real_fold = transformer.Norm.__call__, transformer.Linear.fold
    monkeypatch.setattr(transformer.Norm, "__call__", lambda self, *a: norms.append(self) or real_norm(self, *a))
    monkeypatch.setattr(transformer.Linear, "fold", lambda self, *a, **kw: folds.append((self, "norm" in kw)) or
                        real_fold(self, *a, **kw))
    with torch.inference_mode():
        folded = model.forward(ids, meta, [(k.clone(), v.clone()) for k, v in caches])
    assert norms == [layers[0].input_norm, model.norm]
    want = [(layers[0].o_proj, False), (layers[0].down_proj, False)]
    for layer in layers[1:]:
        want += [(layer.qkv_proj, True), (layer.o_proj, False), (layer.up_proj, True), (layer.down_proj, False)]
    assert folds == want
    unfolded = _assert_plain_and_unfolded_match(monkeypatch, folded, model, _gptj, "fold_layer_norm", ids, meta, caches)
    assert not any(torch.equal(l.input_norm.bias, torch.zeros_like(l.input_norm.bias)) for l in unfolded.layers)


def test_gptj_parallel_residual_adds_in_downs_epilogue(monkeypatch):
    """GPT-J at decode rows where its layers do not fold (SHARDLINE_FOLD_NORMS=0, or a product on
    cuBLAS) but down's kernel takes the residual add: down's epilogue adds attention's output and
    down's bias (no add kernels), and the up projection's epilogue its GELU; the logits are the
    plain path's (down's product accumulating onto attention's output, o's carrying down's bias,
    the activation after the up product)."""
    from shardline.model.layers import Linear
    model, cfg = _gptj()
    assert model.layers[0].post_attention_norm is None and model.layers[0].down_proj.bias is not None
    monkeypatch.setattr(DecoderLayer, "folds", lambda self, h: False)
    ids, meta, caches = _decode_step(cfg, 5, 24)
    folds = []
    real_fold = Linear.fold
    monkeypatch.setattr(Linear, "fold", lambda self, *a, **kw: folds.append(self) or real_fold(self, *a, **kw))
    with torch.inference_mode():
        fused = model.forward(ids, meta, [(k.clone(), v.clone()) for k, v in caches])
    assert folds == [layer.down_proj for layer in model.layers]
    monkeypatch.setattr(Linear, "folds", lambda self, x: False)
    with torch.inference_mode():
        plain = model.forward(ids, meta, [(k.clone(), v.clone()) for k, v in caches])
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
