"""Continuous batching must be invisible: a prompt's tokens do not depend on its batch-mates."""

from __future__ import annotations

import dataclasses

import pytest

from shardline.config import EngineConfig
from shardline.converter import convert
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import LocalPipeline, generate_local
from shardline.tiny import make_tiny_hf_model

PROMPTS = [[1, 5, 9], [1] + list(range(10, 40)), [2], [1, 100, 200, 300, 7, 7, 7],
           list(range(3, 60, 2)), [1, 4], [9] * 17, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("batching")
    hf = make_tiny_hf_model(root / "hf", "llama")
    convert(hf, root / "model", tp=1, pp=2, dtype="fp32", stage_layers=[2, 4])
    return root / "model"


@pytest.mark.parametrize("sampling", [SamplingParams(max_tokens=20, ignore_eos=True),
                                      SamplingParams(max_tokens=20, temperature=0.8, top_k=50, top_p=0.9,
                                                     seed=7, ignore_eos=True)],
                         ids=["greedy", "sampled"])
def test_batch_of_8_equals_each_alone(converted, sampling):
    # A small token budget forces chunked prefill and prefill/decode mixing in one step.
    pipeline = LocalPipeline(converted, config=EngineConfig(max_num_batched_tokens=24, num_blocks=64))
    together = pipeline.generate(PROMPTS, sampling)
    alone = [pipeline.generate([p], sampling)[0] for p in PROMPTS]
    assert together == alone, "a sequence's output changed with the sequences batched beside it"
    assert all(len(t) == 20 for t in together)
    assert all(e.block_manager.num_free_blocks == e.block_manager.num_blocks for e in pipeline.engines), \
        "finished sequences must give back every KV block on every stage"


def test_seeded_sampling_is_a_function_of_seed_and_position(converted):
    pipeline = LocalPipeline(converted, config=EngineConfig(num_blocks=64))
    a = pipeline.generate([PROMPTS[0]], SamplingParams(max_tokens=16, temperature=1.0, seed=1, ignore_eos=True))[0]
    b = pipeline.generate([PROMPTS[0]], SamplingParams(max_tokens=16, temperature=1.0, seed=1, ignore_eos=True))[0]
    c = pipeline.generate([PROMPTS[0]], SamplingParams(max_tokens=16, temperature=1.0, seed=2, ignore_eos=True))[0]
    assert a == b, "same seed must give the same tokens"
    assert a != c, "a different seed should give different tokens at temperature 1"
    # Resume: prompt + the first 6 tokens, continued, must equal the uninterrupted stream.
    resumed = pipeline.generate([PROMPTS[0] + a[:6]], SamplingParams(max_tokens=10, temperature=1.0, seed=1,
                                                                      ignore_eos=True))[0]
    assert resumed == a[6:], "a resumed request must continue exactly where it stopped"


@pytest.fixture(scope="module")
def one_stage(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-stage")
    hf = make_tiny_hf_model(root / "hf", "gpt2", seed=3)
    convert(hf, root / "model", tp=1, pp=1, dtype="fp32")
    return root / "model"


def test_overlapped_decode_changes_no_token(one_stage):
    """Launching step N+1 before reading step N's tokens (the GPU default for one stage) must give
    exactly the tokens of the plain loop, stops and length limits included."""
    params = [SamplingParams(max_tokens=3 + 5 * (i % 4), temperature=0.7 * (i % 2), seed=i,
                             stop_token_ids=(17, 42) if i % 3 == 0 else ()) for i in range(len(PROMPTS))]
    plain = LocalPipeline(one_stage, config=EngineConfig(num_blocks=64, overlap_decode=False))
    overlapped = LocalPipeline(one_stage, config=EngineConfig(num_blocks=64, overlap_decode=True,
                                                              max_num_batched_tokens=24))
    assert overlapped.stepper is not None
    want = plain.generate(PROMPTS, params)
    got = overlapped.generate(PROMPTS, params)
    assert got == want, "overlapped decode must not change any token"
    assert any(len(w) < p.max_tokens for w, p in zip(want, params)), "the test should include early stops"
    bm = overlapped.engines[0].block_manager
    assert bm.num_free_blocks == bm.num_blocks, "lookahead steps must not leak KV blocks"


@pytest.mark.parametrize("max_tokens", [1, 3])
def test_overlapped_decode_frees_sequences_that_finish_with_nothing_left_to_launch(one_stage, max_tokens):
    """Prefill in chunks and short outputs: the last sequences finish at a step after which the
    scheduler has nothing to launch, and the (empty) batch it returns carries their frees. The
    stepper must hand those to the engine: dropped, their blocks stay taken while the scheduler
    counts them free, until a full batch fails with OutOfBlocks (seen at 256 rows on an H200)."""
    pipeline = LocalPipeline(one_stage, config=EngineConfig(num_blocks=64, overlap_decode=True,
                                                            max_num_batched_tokens=32))
    assert pipeline.stepper is not None
    prompts = [[1 + i] * 16 for i in range(8)]
    for _ in range(3):
        out = pipeline.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        assert all(len(o) == max_tokens for o in out)
        bm = pipeline.engines[0].block_manager
        assert not bm.block_tables and bm.num_free_blocks == bm.num_blocks, \
            f"{len(bm.block_tables)} finished sequences still hold KV blocks"


@pytest.mark.parametrize("impl", ["triton", "streamk", "ring"])
def test_a_tuned_table_changes_no_token(converted, impl, monkeypatch):
    """A `tune-gemm` table sending every linear of batches 2-64 to one kernel: the MLP's gate/up
    goes through Linear.glu with SwiGLU in the product (the references on the CPU; the kernels in
    test_gpu_engine.py), and greedy tokens stay those of the plain path."""
    import torch

    from shardline.gemm_tuning import GemmTable, key, linear_shapes
    from shardline.kernels import quant
    from shardline.manifest import Manifest

    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    config = EngineConfig(num_blocks=64)
    want = LocalPipeline(converted, config=config).generate(PROMPTS[:4], sampling)
    shapes = linear_shapes(Manifest.read(converted).model).values()
    table = GemmTable("cpu", {key(n, k, torch.float32, torch.float32): {64: {"impl": impl, "config": {}}}
                              for n, k in shapes})
    tuned = LocalPipeline(converted, config=config)
    for engine in tuned.engines:
        engine.model.configure_gemms(table)
    name = {"triton": "small_m_linear", "streamk": "streamk_linear", "ring": "ring_linear"}[impl]
    real, glu = getattr(quant, name), []
    monkeypatch.setattr(quant, name, lambda *a, **kw: glu.append(kw.get("glu", False)) or real(*a, **kw))
    assert tuned.generate(PROMPTS[:4], sampling) == want
    assert any(glu) and not all(glu), "decode steps ran the table's kernel, SwiGLU fused into gate/up"


@pytest.mark.parametrize("sampling", [SamplingParams(max_tokens=12, ignore_eos=True),
                                      SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=5,
                                                     ignore_eos=True)], ids=["greedy", "sampled"])
def test_pending_rows_take_the_previous_steps_ids_on_the_device(one_stage, sampling, monkeypatch):
    """An overlapped decode row's token is still on the device when its step is launched; the
    engine gathers it there from the previous step's sampled ids (the eager path: no graphs on the
    CPU). With 3 sequences at a time, prompts join while others decode, so prefill chunks and
    pending rows share steps; the tokens must be the plain loop's."""
    plain = LocalPipeline(one_stage, config=EngineConfig(num_blocks=64, overlap_decode=False))
    overlapped = LocalPipeline(one_stage, config=EngineConfig(num_blocks=64, overlap_decode=True, max_num_seqs=3))
    engine = overlapped.engines[0]
    gathered = []
    gather = engine._gather_pending
    monkeypatch.setattr(engine, "_gather_pending", lambda ids, pending: gathered.append(len(pending)) or
                        gather(ids, pending))
    assert overlapped.generate(PROMPTS, sampling) == plain.generate(PROMPTS, sampling), \
        "a pending row read another token than the one its sequence sampled"
    assert sum(gathered) == len(PROMPTS) * (sampling.max_tokens - 1), \
        "every decode row of an overlapped step should have been pending"


def test_overlapped_decode_over_two_tp_ranks_changes_no_token(tmp_path, tiny_hf):
    """With TP = 2 the driver gathers the pending ids before it broadcasts the step's inputs, so
    the followers run plain steps; the tokens must be those of the plain loop."""
    convert(tiny_hf("llama"), tmp_path / "tp2", tp=2, pp=1, dtype="fp32")
    params = [SamplingParams(max_tokens=8, temperature=0.8 * (i % 2), seed=i, ignore_eos=True) for i in range(4)]
    config = EngineConfig(num_blocks=64, max_num_seqs=3)
    want = generate_local(tmp_path / "tp2", PROMPTS[:4], params, dataclasses.replace(config, overlap_decode=False))
    assert generate_local(tmp_path / "tp2", PROMPTS[:4], params, config) == want
