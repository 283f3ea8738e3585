"""The optimised GPU path (Triton kernels, CUDA graphs, bf16) computes what the plain path does.

Speed is worthless if a fused kernel or a replayed graph changes the answer: logits stay within
bf16 tolerance of the fp32 reference, and greedy tokens match the unoptimised path for 64 steps.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from gemm_tables import gemm_table

from shardline.config import EngineConfig
from shardline.converter import convert
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import LocalPipeline
from shardline.tiny import add_fp8_kv_scales

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; the CPU path is "
                                 "covered by test_matches_hf.py and test_batching.py")]

GPU = EngineConfig(device="cuda", num_blocks=256)  # several pipelines share the GPU in this process
PROMPTS = [[1, 17, 42, 99, 7, 250, 3], [1] + list(range(5, 70)), [2, 9], [1, 100, 200] * 7]


# gptj-wide: GPT-J's 256-wide heads (two of them), which take their own decode attention tile
# and run rotary in its own kernel ahead of attention above one row (triton_attention.decode_config_for).
MODELS = {"llama": ("llama", {}), "gptj": ("gptj", {}), "gpt2": ("gpt2", {}),
          "gptj-wide": ("gptj", dict(n_embd=512, n_head=2, n_layer=2, rotary_dim=64))}


@pytest.fixture(scope="module", params=sorted(MODELS))
def models(request, tmp_path_factory, tiny_hf):
    family, overrides = MODELS[request.param]
    hf = tiny_hf(family, **overrides)
    root = tmp_path_factory.mktemp(f"gpu-{request.param}")
    convert(hf, root / "fp32", tp=1, pp=2, dtype="fp32")
    convert(hf, root / "bf16", tp=1, pp=2, dtype="bf16")
    if family != "gpt2":  # keys 37.5 times larger, values 80 times smaller, with their fp8 KV scales
        shutil.copytree(hf, root / "hf-kv-scaled")
        convert(add_fp8_kv_scales(root / "hf-kv-scaled", 37.5, 0.0125), root / "fp32-kv-scaled", tp=1, pp=2,
                dtype="fp32")
    return root


def run_unoptimised(code: str):
    """Run `code` (which prints JSON last) with every kernel's torch reference and no graphs, in
    its own process: the kernel switch is read once at import."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "SHARDLINE_DISABLE_TRITON": "1"})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def unoptimised(model_dir, prompts, max_tokens, kv_cache_dtype: str = "auto") -> list[list[int]]:
    return run_unoptimised(
        "import json; from shardline.stage_worker.pipeline import generate_local; "
        "from shardline.sampling import SamplingParams; from shardline.config import EngineConfig; "
        f"print(json.dumps(generate_local({str(model_dir)!r}, {prompts!r}, "
        f"SamplingParams(max_tokens={max_tokens}, ignore_eos=True), "
        f"EngineConfig(device='cuda', num_blocks=256, kv_cache_dtype={kv_cache_dtype!r}))))")


def reference_logits(model_dir, sequences) -> list:
    """Logits of every position of each sequence on the unoptimised path."""
    out = run_unoptimised(
        "import json; from shardline.stage_worker.pipeline import LocalPipeline; "
        "from shardline.config import EngineConfig; "
        f"p = LocalPipeline({str(model_dir)!r}, config=EngineConfig(device='cuda', num_blocks=256)); "
        f"print(json.dumps([p.logits(s).tolist() for s in {sequences!r}]))")
    return [torch.tensor(x) for x in out]


def test_every_decode_graph_is_captured_before_the_first_request(models):
    config = EngineConfig(device="cuda", num_blocks=256, max_num_seqs=20)
    runner = LocalPipeline(models / "fp32", config=config).engines[0].graphs
    assert runner.batch_buckets == [1, 2, 4, 8, 16, 20] and runner.context_buckets == [256]  # 256 positions
    assert set(runner.graphs) == {(b, c) for b in runner.batch_buckets for c in runner.context_buckets}
    lazy = LocalPipeline(models / "fp32", config=dataclasses.replace(config, capture_graphs_at_start=False))
    assert not lazy.engines[0].graphs.graphs


def test_bf16_logits_within_tolerance_of_fp32(models):
    ref = LocalPipeline(models / "fp32", config=GPU)
    fast = LocalPipeline(models / "bf16", config=GPU)
    for p in PROMPTS:
        want, got = ref.logits(p), fast.logits(p)
        err = (got - want).abs().max().item()
        scale = want.abs().max().item()
        assert err <= 0.03 * scale + 0.02, f"bf16 logits off by {err:.3g} (max |logit| {scale:.3g})"


def test_greedy_64_steps_fp32_identical_to_unoptimised_path(models):
    fast = LocalPipeline(models / "fp32", config=GPU)
    assert fast.engines[0].graphs is not None, "decode steps should replay CUDA graphs on the GPU"
    got = fast.generate(PROMPTS, SamplingParams(max_tokens=64, ignore_eos=True))
    assert fast.engines[0].graphs.num_replays, "no decode step replayed a captured graph"
    assert got == unoptimised(models / "fp32", PROMPTS, 64), "fused shardline/kernels/graphs changed greedy tokens"


@pytest.mark.parametrize("weights", ["fp32", "fp32-kv-scaled"])
def test_greedy_64_steps_fp32_over_an_fp8_cache_identical_to_unoptimised_path(models, weights):
    """An e4m3 KV cache: the kernels (the cache writes, rotary fused or not, both attention
    kernels) and the graphs round K and V as the references do, so fp32 greedy tokens match; with
    a checkpoint's per-tensor k and v scales too (divided out as written, multiplied back in the
    scores' scale and on the output)."""
    if not (models / weights).exists():
        pytest.skip("add_fp8_kv_scales does not rescale GPT-2's fused c_attn")
    fast = LocalPipeline(models / weights, config=dataclasses.replace(GPU, kv_cache_dtype="fp8"))
    assert fast.engines[0].kv_cache.k.dtype == torch.float8_e4m3fn
    got = fast.generate(PROMPTS, SamplingParams(max_tokens=64, ignore_eos=True))
    assert fast.engines[0].graphs.num_replays, "no decode step replayed a captured graph"
    assert got == unoptimised(models / weights, PROMPTS, 64, kv_cache_dtype="fp8")


def assert_reference_greedy_choices(model_dir, got) -> None:
    """In bf16 two correct kernels may round a near-tie differently, and a random tiny model has
    many near-ties; so every token the fast path picks must be the reference's argmax up to bf16
    rounding of the reference's own logits (teacher-forced on the fast path's tokens)."""
    refs = reference_logits(model_dir, [p + g[:-1] for p, g in zip(PROMPTS, got)])
    for p, g, ref in zip(PROMPTS, got, refs):
        rows = ref[len(p) - 1:]  # (64, V): the logits each generated token was drawn from
        chosen = rows.gather(1, torch.tensor(g)[:, None])[:, 0]
        slack = 0.03 * rows.abs().amax(dim=1) + 0.02
        bad = (chosen < rows.max(dim=1).values - slack).nonzero().flatten().tolist()
        assert not bad, f"steps {bad} picked a token the reference ranks clearly below its argmax"


def test_greedy_64_steps_bf16_are_reference_greedy_choices(models):
    fast = LocalPipeline(models / "bf16", config=GPU)
    assert_reference_greedy_choices(models / "bf16", fast.generate(PROMPTS, SamplingParams(max_tokens=64,
                                                                                           ignore_eos=True)))


def test_tuned_split_k_with_fused_swiglu_keeps_fp32_greedy_tokens(models, tmp_path):
    """Decode steps of 4 rows through the split-K kernel (PDL, SwiGLU in its epilogue where the MLP
    is gated), as a tuned table sends batches 2-64: the unoptimised path's greedy tokens."""
    table = gemm_table(models / "fp32", tmp_path / "gemm.json", torch.float32, {"impl": "triton", "config": dict(
        BLOCK_N=32, BLOCK_K=64, SPLIT_K=2, num_warps=4, num_stages=3)})
    fast = LocalPipeline(models / "fp32", config=dataclasses.replace(GPU, gemm_config=table))
    got = fast.generate(PROMPTS, SamplingParams(max_tokens=64, ignore_eos=True))
    assert got == unoptimised(models / "fp32", PROMPTS, 64), "the tuned kernels changed greedy tokens"


def test_tuned_stream_k_keeps_bf16_greedy_choices(models, tmp_path):
    table = gemm_table(models / "bf16", tmp_path / "gemm.json", torch.bfloat16, {"impl": "streamk", "config": dict(
        BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, num_warps=4, num_stages=3, PROGRAMS=7)})
    fast = LocalPipeline(models / "bf16", config=dataclasses.replace(GPU, gemm_config=table))
    assert_reference_greedy_choices(models / "bf16", fast.generate(PROMPTS, SamplingParams(max_tokens=64,
                                                                                           ignore_eos=True)))


@pytest.mark.parametrize("ring", [dict(BLOCK_N=64, BLOCK_K=64, STAGES=3, SPLIT_K=2),
                                  dict(SUB=16, BLOCK_K=64, STAGES=3),
                                  dict(BLOCK_N=64, BLOCK_K=128, STAGES=4, SPLIT_K=2, MAXNREG=128)],
                         ids=["tiled", "balanced", "capped"])
def test_tuned_ring_gemm_keeps_bf16_greedy_choices(models, tmp_path, ring):
    """Every linear at 2-64 rows through the ring GEMM (Gluon, Hopper), tiled with K split or in
    its balanced form: SwiGLU in its epilogue where the MLP is gated, biases where the model has
    them, the logits' fp32 from its sums."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the ring GEMM is for Hopper and later (TMA, wgmma)")
    pytest.importorskip("triton.experimental.gluon", reason="the ring GEMM is written in Gluon")
    table = gemm_table(models / "bf16", tmp_path / "gemm.json", torch.bfloat16, {"impl": "ring", "config": ring})
    fast = LocalPipeline(models / "bf16", config=dataclasses.replace(GPU, gemm_config=table))
    assert_reference_greedy_choices(models / "bf16", fast.generate(PROMPTS, SamplingParams(max_tokens=64,
                                                                                           ignore_eos=True)))


def test_tuned_exp12_products_keep_bf16_greedy_choices(tmp_path, tiny_hf):
    """Every layer's products in the 12-bit form (kernels/exp12.py) for decode steps of up to 64
    rows: gate/up and qkv with the RMSNorm folded in (SwiGLU in gate/up's epilogue), o and down
    with K split and the residual added, the out-of-window weights corrected; the head through
    the ring GEMM. The reference's greedy choices. The tiny models' 96-wide hidden is not a
    multiple of the form's 64-column blocks, so this llama is 128 wide."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the 12-bit kernel is for Hopper (TMA, wgmma with a register operand)")
    pytest.importorskip("triton.experimental.gluon", reason="the 12-bit kernel is written in Gluon")
    hf = tiny_hf("llama", hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 intermediate_size=256)
    convert(hf, tmp_path / "bf16", tp=1, pp=2, dtype="bf16")
    ring = {"impl": "ring", "config": dict(BLOCK_N=64, BLOCK_K=64, STAGES=3, SPLIT_K=2)}
    split = {"impl": "exp12", "config": {"BLOCK_K": 64, "STAGES": 4, "SPLIT_K": 2}}
    table = gemm_table(tmp_path / "bf16", tmp_path / "gemm.json", torch.bfloat16, ring,
                        {"up_proj": {"impl": "exp12", "config": {"BLOCK_K": 128, "STAGES": 4}},
                         "qkv_proj": split, "o_proj": split, "down_proj": split})
    fast = LocalPipeline(tmp_path / "bf16", config=dataclasses.replace(GPU, gemm_config=table))
    layers = [layer for engine in fast.engines for layer in engine.model.layers]
    lins = [lin for layer in layers for lin in (layer.qkv_proj, layer.o_proj, layer.up_proj, layer.down_proj)]
    assert lins and all(lin.exp12 is not None and (lin._choice(lin.weight.new_empty(64, lin.weight.shape[1])) or {})
                        .get("impl") == "exp12" for lin in lins)  # packed, and the table's configs run
    assert_reference_greedy_choices(tmp_path / "bf16", fast.generate(PROMPTS, SamplingParams(max_tokens=64,
                                                                                             ignore_eos=True)))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (one per TP rank); the gloo run "
                    "of the same ranks is covered on the CPU")
def test_two_tp_ranks_on_two_gpus_match_the_cpu_ranks_and_exit(tmp_path, tiny_hf):
    """generate_local with TP = 2 over NCCL, graphs captured around the all-reduces: the same greedy
    tokens as the same two ranks over gloo on the CPU, and the ranks exit afterwards (tearing the
    NCCL group down once graphs captured it used to hang them: pytorch/pytorch#115388)."""
    from shardline.stage_worker.pipeline import generate_local

    convert(tiny_hf("llama"), tmp_path / "tp2", tp=2, pp=2, dtype="fp32")
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    want = generate_local(tmp_path / "tp2", PROMPTS, sampling, EngineConfig(num_blocks=64))
    got = generate_local(tmp_path / "tp2", PROMPTS, sampling, EngineConfig(device="cuda", num_blocks=64))
    assert got == want


def test_graphs_recaptured_after_reset_give_the_same_tokens(models):
    """`CudaGraphRunner.reset` (used to A/B kernel tiles) drops graphs and pool; the steps after it
    capture again and generate what the first graphs did."""
    fast = LocalPipeline(models / "bf16", config=GPU)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    first = fast.generate(PROMPTS, params)
    runner = fast.engines[0].graphs
    runner.reset()
    assert not runner.graphs and runner.pool is None
    assert fast.generate(PROMPTS, params) == first
    assert runner.graphs, "the steps after the reset captured their graphs again"


@pytest.fixture(scope="module")
def one_stage(tmp_path_factory, tiny_hf):
    """A tiny Llama as one stage in fp32: overlapped decode, whose graphs gather their pending ids
    and take their greedy argmax themselves."""
    root = tmp_path_factory.mktemp("gpu-one-stage")
    convert(tiny_hf("llama"), root / "fp32", tp=1, pp=1, dtype="fp32")
    return root / "fp32"


def trace_steps(engine) -> list[tuple[bool, bool]]:
    """(replayed a graph, had pending rows) of every step `engine` runs from now on."""
    steps = []
    execute = engine.execute

    def traced(batch, inputs, defer_tokens=False, pending=None):
        replays = engine.graphs.num_replays
        out = execute(batch, inputs, defer_tokens, pending)
        steps.append((engine.graphs.num_replays > replays, bool(pending)))
        return out

    engine.execute = traced
    return steps


def eager_twin(config: EngineConfig) -> EngineConfig:
    """`config` without graphs or overlap: every step eager, its tokens read before the next."""
    return dataclasses.replace(config, use_cuda_graphs=False, overlap_decode=False)


MIXED = [SamplingParams(max_tokens=24, temperature=0.8 * (i % 2), top_k=50 * (i % 2), seed=i, ignore_eos=True)
         for i in range(len(PROMPTS))]


@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("params", [SamplingParams(max_tokens=24, ignore_eos=True), MIXED], ids=["greedy", "mixed"])
def test_overlapped_graph_steps_give_the_eager_paths_tokens(one_stage, params, kv):
    """Each overlapped decode step is one replay: its pending rows take the previous replay's argmax
    inside the graph (or, for rows drawn at a temperature, the drawn ids copied back into the
    graph's buffer). The tokens must be those of eager steps read one at a time, over either cache."""
    config = dataclasses.replace(GPU, kv_cache_dtype=kv)
    want = LocalPipeline(one_stage, config=eager_twin(config)).generate(PROMPTS, params)
    fast = LocalPipeline(one_stage, config=config)
    assert fast.stepper is not None, "a one-stage model on the GPU decodes overlapped"
    steps = trace_steps(fast.engines[0])
    assert fast.generate(PROMPTS, params) == want, "a graph step read another id than its row's last token"
    assert sum(graph and pending for graph, pending in steps) >= 16, "decode steps should replay graphs with pending rows"


@pytest.mark.parametrize("folded", [True, False], ids=["folded", "qkv-on-cublas"])
def test_the_head_writes_the_logits_only_for_steps_that_draw(one_stage, tmp_path, folded):
    """The head on the split-K kernel leaves the greedy ids from its epilogue and skips the logits
    in steps where every row is greedy: with every linear there (the layers fold their norms, and
    the head the final one), or with qkv on cuBLAS (no layer folds; the head multiplies the
    normed rows). The rows drawn at a temperature stop after 6 tokens and the greedy ones run
    on, so graph steps of both kinds follow each other: the drawn rows must read this step's
    logits, not a stale buffer, and every row must get the eager path's tokens on the same table."""
    table = gemm_table(one_stage, tmp_path / "gemm.json", torch.float32, {"impl": "triton", "config": dict(
        BLOCK_N=32, BLOCK_K=64, SPLIT_K=2, num_warps=4, num_stages=3)},
        overrides=None if folded else {"qkv_proj": {"impl": "cublas", "config": None}})
    config = dataclasses.replace(GPU, gemm_config=table)
    params = [SamplingParams(max_tokens=6, temperature=0.9, seed=i, ignore_eos=True) if i % 2 else
              SamplingParams(max_tokens=20, ignore_eos=True) for i in range(len(PROMPTS))]
    want = LocalPipeline(one_stage, config=eager_twin(config)).generate(PROMPTS, params)
    fast = LocalPipeline(one_stage, config=config)
    engine = fast.engines[0]
    rows = torch.empty(4, engine.model.cfg.hidden_size, dtype=engine.model.dtype, device="cuda")
    assert engine.model.layers[-1].folds(rows) == folded, "the table should (not) fold the layers' norms"
    assert engine.model.lm_head.folds(rows), "the head should run the split-K kernel, whose epilogue leaves the ids"
    wanted = []
    prepare = engine._prepare

    def recording(batch):
        wanted.append(prepare(batch))
        return wanted[-1]

    engine._prepare = recording
    steps = trace_steps(engine)
    assert fast.generate(PROMPTS, params) == want, "a drawn row read logits the head did not write"
    graph_steps = [s.needs_logits for s, (graph, _) in zip(wanted, steps) if graph]
    assert True in graph_steps and False in graph_steps, "the test should replay graphs of both kinds"


def test_a_prompt_joining_between_graph_steps_keeps_every_token(one_stage):
    """Two sequences at a time: as one finishes a prompt joins, and its prefill step runs eagerly
    between graph steps. That eager step gathers the decoding row's pending id from the last
    replay's buffer; the replay after it reads the ids the eager step sampled (greedy and drawn).
    Graphs are captured on first use, here with rows pending, so the capture's warm-up must leave
    the previous step's ids in place."""
    params = [SamplingParams(max_tokens=6 + 5 * i, temperature=0.8 * (i % 2), seed=i, ignore_eos=True)
              for i in range(len(PROMPTS))]
    config = dataclasses.replace(GPU, max_num_seqs=2, capture_graphs_at_start=False)
    want = LocalPipeline(one_stage, config=eager_twin(config)).generate(PROMPTS, params)
    fast = LocalPipeline(one_stage, config=config)
    steps = trace_steps(fast.engines[0])
    assert fast.generate(PROMPTS, params) == want, "a pending id crossed an eager step wrongly"
    pairs = list(itertools.pairwise(steps))
    assert any(before[0] and not after[0] and after[1] for before, after in pairs), \
        "the test should run an eager step with pending rows right after a graph step"
    assert any(not before[0] and after[0] and after[1] for before, after in pairs), \
        "the test should replay a graph with pending rows right after an eager step"
