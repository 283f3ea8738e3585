"""A replica runs its eager kernels once before it serves, and forgets that it did.

On a GPU, Triton compiles a kernel the first time a step meets a new specialization (~0.8 s, while
every request on the replica waits); the engine's start-up warm-up meets them first. Here, on CPU:
which token counts it runs, and that it leaves no trace (blocks, ids, counters, tokens).
"""

from __future__ import annotations

import logging

import pytest
import torch

from shardline.config import EngineConfig
from shardline.converter import convert
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import LocalPipeline
from shardline.stage_worker.engine import warm_up_token_counts
from shardline.tiny import make_tiny_hf_model

PROMPTS = [[1, 5, 9, 4], [1] + list(range(10, 40)), [2], [7] * 19]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def two_stage(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm-up")
    convert(make_tiny_hf_model(root / "hf", "llama", seed=11), root / "model", tp=1, pp=2, dtype="fp32")
    return root / "model"


def test_token_counts_cover_each_bucket_range_divisible_by_16_and_not():
    buckets = {1, 2, 4, 8, 16, 24, 32, 48, 64}
    counts = warm_up_token_counts(buckets, 2048)
    edges = sorted(buckets) + [2048]
    for lo, hi in zip(edges, edges[1:]):
        inside = [c for c in counts if lo < c <= hi]
        kinds = {c % 16 == 0 for c in inside}
        possible = {c % 16 == 0 for c in range(lo + 1, hi + 1)}
        assert kinds == possible, f"counts {inside} in ({lo}, {hi}] miss a kind Triton compiles for"
        smallest = [c for c in inside if c != 2048]  # and a full step
        assert len(smallest) == len(possible), f"one count of each kind in ({lo}, {hi}]: {inside}"
    assert 1 not in counts and counts[-1] == 2048 and counts == sorted(set(counts))
    assert warm_up_token_counts(set(), 1) == []
    assert warm_up_token_counts(set(), 40) == [2, 16, 40]


def test_warm_up_leaves_no_trace(two_stage, caplog):
    config = EngineConfig(num_blocks=64)
    expected = LocalPipeline(two_stage, config=config).generate(PROMPTS, GREEDY)
    pipeline = LocalPipeline(two_stage, config=config)
    with caplog.at_level(logging.INFO, logger="shardline.stage_worker"):
        for engine in pipeline.engines:  # stage 1 takes the hidden stream, stage 0 token ids
            engine.warm_up([2, 17, 33, 64, 5000])  # 5000: more than the cache holds, skipped
    assert sum("warmed up the eager kernels" in r.getMessage() for r in caplog.records) == 2
    for engine in pipeline.engines:
        bm = engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks and bm.request_ids == []
        assert (engine.num_steps, engine.num_tokens, engine.busy_seconds) == (0, 0, 0.0)
        assert engine.last_sampled is None
    assert pipeline.generate(PROMPTS, GREEDY) == expected


def test_the_engine_warms_up_only_where_it_compiles(two_stage, monkeypatch):
    """A CPU engine (the reference kernels, nothing to compile) and a lazy-graphs one skip it."""
    calls = []
    from shardline.stage_worker.engine import StageEngine
    monkeypatch.setattr(StageEngine, "warm_up", lambda self, counts: calls.append(counts))
    LocalPipeline(two_stage, config=EngineConfig(num_blocks=64))
    assert calls == []
    if torch.cuda.is_available():
        LocalPipeline(two_stage, config=EngineConfig(device="cuda", num_blocks=64))
        assert len(calls) == 2 and all(2 in c and 2048 in c for c in calls)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton compiles only on a GPU; the CPU tests "
                    "above check what the warm-up runs and that it leaves no trace")
def test_after_the_warm_up_serving_compiles_nothing(tmp_path):
    """Prompts of every length up to 100 tokens, 1 to 40 at a time, mixing prefill chunks and
    decode rows: after the start-up warm-up none of their steps compiles a Triton kernel."""
    import random

    from triton import knobs

    from shardline.kernels._dispatch import log_compiles

    convert(make_tiny_hf_model(tmp_path / "hf", "llama", seed=12), tmp_path / "model", tp=1, pp=1, dtype="bf16")
    pipeline = LocalPipeline(tmp_path / "model", config=EngineConfig(device="cuda", num_blocks=512,
                                                                    max_num_batched_tokens=256))
    compiles: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            compiles.append(record.getMessage())

    log = logging.getLogger("test.warm_up.compiles")
    log.addHandler(Collect())
    log_compiles(log)
    try:
        rng = random.Random(0)
        for n in (1, 3, 17, 40):
            prompts = [[rng.randrange(1, 200) for _ in range(rng.randrange(1, 101))] for _ in range(n)]
            pipeline.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    finally:
        knobs.runtime.jit_cache_hook = knobs.runtime.jit_post_compile_hook = None
    assert compiles == [], f"{len(compiles)} compiles while serving after the warm-up:\n" + "\n".join(compiles)
