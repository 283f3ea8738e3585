"""What a decode graph does, run eagerly on the CPU: CudaGraphRunner's packing, the step taken
from its mailbox, its pending rows read from `sampled`, its greedy argmax written there and given
to the host ring, and the engine's bookkeeping around it (drawn ids copied back, eager steps in
between). test_gpu_engine.py replays real graphs."""

from __future__ import annotations

import pytest
import torch

from shardline.config import EngineConfig
from shardline.converter import convert
from shardline.sampling import SamplingParams
from shardline.stage_worker.cuda_graphs import CudaGraphRunner
from shardline.stage_worker.pipeline import LocalPipeline

PROMPTS = [[1, 17, 42, 99, 7, 250, 3], [1] + list(range(5, 70)), [2, 9], [1, 100, 200] * 7, [5], [3, 3, 3, 3]]


class ReplayedEagerly(CudaGraphRunner):
    """A runner whose 'graph' runs the step's Python on every replay. Its graphs have exactly the
    step's rows: the CPU reference kernels do not skip the slot -1 of padding rows."""

    def buckets(self, num_seqs: int, max_seq_len: int) -> tuple[int, int] | None:
        key = super().buckets(num_seqs, max_seq_len)
        return key and (num_seqs, key[1])

    def _capture(self, b: int, ctx: int):
        step = self._step(b, ctx)
        cfg = self.model.cfg
        out = torch.empty(b, cfg.vocab_size if self.model.is_last else cfg.hidden_size)  # logits, or the stream
        replayed = self._replayed

        class Replay:
            @staticmethod
            def replay() -> None:  # the step taken from the mailbox, run, its ids given to the ring
                out.copy_(replayed(b, ctx, step))

        return Replay(), out


@pytest.fixture(scope="module")
def one_stage(tmp_path_factory, tiny_hf):
    root = tmp_path_factory.mktemp("graph-steps")
    convert(tiny_hf("llama"), root / "model", tp=1, pp=1, dtype="fp32")
    return root / "model"


def with_graphs(model_dir, config: EngineConfig) -> LocalPipeline:
    pipeline = LocalPipeline(model_dir, config=config)
    engine = pipeline.engines[0]
    engine.graphs = ReplayedEagerly(engine.model, engine.kv_layers, config.max_num_seqs, engine.max_model_len,
                                    config.block_size)
    return pipeline


GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)
MIXED = [SamplingParams(max_tokens=4 + 3 * i, temperature=0.8 * (i % 2), top_k=20 * (i % 2), seed=i,
                        ignore_eos=True) for i in range(len(PROMPTS))]


@pytest.mark.parametrize("params", [GREEDY, MIXED], ids=["greedy", "mixed"])
@pytest.mark.parametrize("max_num_seqs", [3, 8], ids=["joining", "all-at-once"])
def test_graph_steps_give_the_plain_loops_tokens(one_stage, params, max_num_seqs):
    """Overlapped decode through the graph path: pending rows read the previous step's ids in the
    graph, drawn ids reach the graph's buffer, and with 3 sequences at a time prompts join
    (eager steps) between graph steps. Every token must be the plain loop's."""
    config = EngineConfig(num_blocks=64, max_num_seqs=max_num_seqs)
    want = LocalPipeline(one_stage, config=EngineConfig(num_blocks=64, overlap_decode=False)).generate(PROMPTS, params)
    fast = with_graphs(one_stage, config)
    assert fast.generate(PROMPTS, params) == want, "a graph step fed or returned the wrong ids"
    assert fast.engines[0].graphs.num_replays >= 8, "decode steps should have taken the graph path"


@pytest.mark.parametrize("params", [GREEDY, MIXED], ids=["greedy", "mixed"])
def test_two_stages_on_graphs_give_the_plain_loops_tokens(tmp_path, tiny_hf, params):
    """PP = 2, each stage on the graph path: stage 0 takes host ids from its mailbox and gives no
    ids; stage 1 takes the hidden rows as a device copy beside its mailbox and gives its greedy
    ids to its host ring. Every token must be the plain loop's."""
    convert(tiny_hf("llama"), tmp_path / "model", tp=1, pp=2, dtype="fp32")
    config = EngineConfig(num_blocks=64, max_num_seqs=8)
    want = LocalPipeline(tmp_path / "model", config=config).generate(PROMPTS, params)
    fast = LocalPipeline(tmp_path / "model", config=config)
    for engine in fast.engines:
        engine.graphs = ReplayedEagerly(engine.model, engine.kv_layers, config.max_num_seqs, engine.max_model_len,
                                        config.block_size)
    assert fast.generate(PROMPTS, params) == want, "a stage's graph step took or gave the wrong rows"
    assert all(e.graphs.num_replays >= 4 for e in fast.engines), "both stages should have replayed graphs"
    assert fast.engines[0].graphs.host_ids is None and fast.engines[1].graphs.host_ids is not None


def test_a_step_with_an_unsampled_one_token_chunk_runs_eagerly(one_stage):
    """A token budget that leaves one token for a prompt gives a step of one-token chunks whose
    last samples nothing. A graph's row i is the step's i-th sampled row, so that step must run
    eagerly (a graph would hand the sampler a row more than it has parameters for)."""
    prompts = [[1, 5], [2, 6], [3, 7, 8, 9, 10]]
    params = [SamplingParams(max_tokens=6, temperature=0.7 * (i % 2), seed=i, ignore_eos=True) for i in range(3)]
    want = LocalPipeline(one_stage, config=EngineConfig(num_blocks=64, overlap_decode=False)).generate(prompts, params)
    # Step 2: the first sequence's decode, the second's last prompt token, the third's first (unsampled).
    fast = with_graphs(one_stage, EngineConfig(num_blocks=64, max_num_batched_tokens=3))
    assert fast.generate(prompts, params) == want


def test_a_step_reads_its_logits_only_when_a_row_draws_or_returns_them(one_stage):
    """HostStep.needs_logits, which a decode graph hands its head (0: write only the greedy ids):
    false when every sampled row is greedy, true when one draws at a temperature or the batch
    returns its logits."""
    from shardline.stage_worker.batch import SequenceChunk, StageBatch
    engine = LocalPipeline(one_stage, config=EngineConfig(num_blocks=64)).engines[0]
    hot = SamplingParams(max_tokens=4, temperature=0.7, seed=1)

    def needs(chunks, **kw) -> bool:
        batch = StageBatch(chunks, **kw)
        try:
            return engine._prepare(batch).needs_logits
        finally:
            engine.free([c.request_id for c in chunks])

    assert needs([SequenceChunk("a", 0, 3, True, GREEDY), SequenceChunk("b", 0, 2, True, GREEDY)]) is False
    assert needs([SequenceChunk("a", 0, 3, True, GREEDY), SequenceChunk("b", 0, 2, True, hot)]) is True
    assert needs([SequenceChunk("a", 0, 3, True, GREEDY), SequenceChunk("b", 0, 2, False, hot)]) is False, \
        "a chunk that samples nothing reads no logits"
    assert needs([SequenceChunk("a", 0, 3, True)], return_logits=True) is True


def test_a_capture_sees_no_garbage_collection():
    """collected_garbage (around every capture): a dead cycle is freed before the capture starts,
    none is collected inside it, and the collector runs again after it, also when the capture
    raises."""
    import gc
    import weakref

    from shardline.graph_capture import collected_garbage

    class Node:
        pass

    def dead_cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    assert gc.isenabled()
    ref = dead_cycle()
    with collected_garbage():
        assert ref() is None, "the dead cycle must be freed before the capture"
        assert not gc.isenabled()
        inside = dead_cycle()
        kept = [Node() for _ in range(3 * gc.get_threshold()[0])]  # would trigger a collection
        assert inside() is not None, "a collection ran inside the capture"
        del kept
    assert gc.isenabled()
    gc.collect()
    assert inside() is None
    with pytest.raises(RuntimeError):
        with collected_garbage():
            raise RuntimeError("capture failed")
    assert gc.isenabled()
