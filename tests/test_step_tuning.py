"""`shardline tune-gemm --in-step` (shardline/step_tuning.py): which candidate it keeps, how a
choice is written into the table, and its argument errors. The timing itself needs CUDA graphs;
the GPU test refines a small model's table and checks the engine still decodes the same tokens."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from shardline import step_tuning
from shardline.gemm_tuning import GemmTable, key

K = key(4096, 4096, torch.bfloat16, torch.bfloat16)
RING = {"impl": "ring", "config": {"BLOCK_N": 64, "BLOCK_K": 128, "STAGES": 4, "SPLIT_K": 1}}


def test_pick_keeps_the_current_choice_unless_another_beats_it_by_the_margin():
    assert step_tuning.pick([[4.80, 4.81], [4.79, 4.80], [5.0, 5.1]], margin=0.003)[0] == 0, "0.2% is noise"
    chosen, medians = step_tuning.pick([[4.80, 4.82], [4.70, 4.72], [4.75, 4.74]], margin=0.003)
    assert chosen == 1 and medians == pytest.approx([4.81, 4.71, 4.745])
    assert step_tuning.pick([[4.8], [float("inf")], [4.6]], margin=0.003)[0] == 2, "a failed candidate never wins"
    assert step_tuning.pick([[float("inf")], [5.0]], margin=0.003)[0] == 1, "a current choice that fails is replaced"


def test_with_choice_writes_one_entry_of_a_copy_and_default_removes_it():
    table = GemmTable("gpu", {K: {64: {"impl": "cublas", "config": None, "us": 11.5}}})
    trial = step_tuning.with_choice(table, K, 16, dict(RING, step_ms=4.7))
    assert trial.entries[K] == {64: table.entries[K][64], 16: {"impl": "ring", "config": RING["config"]}}
    assert 16 not in table.entries[K], "the table passed in is left as it was"
    assert trial.choice(4096, 4096, torch.bfloat16, torch.bfloat16, 16)["impl"] == "ring"
    gone = step_tuning.with_choice(trial, K, 16, dict(step_tuning.DEFAULT))
    assert gone.choice(4096, 4096, torch.bfloat16, torch.bfloat16, 16)["impl"] == "cublas", "16 borrows 64's again"
    empty = step_tuning.with_choice(GemmTable("gpu", {K: {16: RING}}), K, 16, dict(step_tuning.DEFAULT))
    assert K not in empty.entries, "no empty shape keys left behind"


def test_current_choice_is_the_batchs_own_entry_not_a_borrowed_one():
    table = GemmTable("gpu", {K: {64: dict(RING, us=15.0)}})
    assert step_tuning.current_choice(table, K, 64) == RING
    assert step_tuning.current_choice(table, K, 16) == step_tuning.DEFAULT
    assert "no entry" in step_tuning.label(step_tuning.DEFAULT)
    assert step_tuning.label(RING) == "ring BLOCK_N=64,BLOCK_K=128,STAGES=4,SPLIT_K=1"


def tune_gemm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardline.cli", "tune-gemm", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_in_step_refuses_tensor_parallel_shapes_by_name(tmp_path):
    out = tune_gemm("--shape", "llama3-8b", "--tp", "2", "--in-step", "--out", str(tmp_path / "t.json"))
    assert out.returncode == 2 and "--in-step" in out.stderr and "tp=2" in out.stderr, out.stderr
    assert not (tmp_path / "t.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a GPU gets")
def test_tune_gemm_without_a_gpu_says_so(tmp_path):
    out = tune_gemm("--shape", "llama3-8b", "--in-step", "--out", str(tmp_path / "t.json"))
    assert out.returncode == 2 and "needs a CUDA GPU" in out.stderr, out.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="refining times captured decode steps on a CUDA GPU")
def test_refine_in_step_writes_choices_the_engine_decodes_the_same_tokens_with():
    from shardline.config import ModelConfig
    from shardline.model.random_weights import LLAMA_SMALL
    from shardline.sampling import SamplingParams
    from shardline.stage_worker.pipeline import LocalPipeline

    cfg = ModelConfig(**LLAMA_SMALL)
    # fp32: the candidates differ from cuBLAS only in summation order, so greedy tokens are kept exactly
    engine = step_tuning.random_engine(cfg, "fp32", "none", max_num_seqs=16, kv_bytes=64 << 20, max_model_len=512)
    pipeline = LocalPipeline(None, config=engine.config, engines=[engine])
    prompts = [[(7 * i + j) % 1000 for j in range(12)] for i in range(8)]
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    before = pipeline.generate(prompts, greedy)
    rows = []
    table = step_tuning.refine(engine, GemmTable(torch.cuda.get_device_name()), [8], cfg, torch.float32,
                               linears=("qkv_proj", "down_proj"), rounds=1, report=rows.append)
    timed = [r for r in rows if "candidate" in r and "error" not in r]
    assert {r["linear"] for r in timed} == {"qkv_proj", "down_proj"}
    assert all(r["step_ms"] > 0 for r in timed) and sum(r["current"] for r in timed) == 2
    assert all(m == 8 for by_m in table.entries.values() for m in by_m), "only the batch refined gets entries"
    engine.model.configure_gemms(table)
    engine.graphs.reset()
    assert pipeline.generate(prompts, greedy) == before


def test_a_candidate_is_checked_in_the_form_the_engine_runs_it():
    """The gated MLP's gate/up is checked as silu(gate) * up through Linear.glu (where the ring and
    split-K kernels fuse it), the others as the plain product; an entry that cannot run is no
    candidate. On the CPU every implementation is its reference, so all of these agree."""
    from shardline.model.layers import Linear
    lin = Linear(torch.randn(64, 32) * 0.1, bias=torch.randn(64) * 0.1)
    for choice in ({"impl": "cublas", "config": None}, {"impl": "ring", "config": {"SUB": 16}},
                   {"impl": "triton", "config": {"BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 2}}):
        assert step_tuning._agrees(lin, choice, 4, torch.float32, glu=True), choice
        assert step_tuning._agrees(lin, choice, 4, torch.float32, glu=False), choice
    assert not step_tuning._agrees(lin, {"impl": "ring", "config": {"SUB": 12}}, 4, torch.float32, glu=False)
    assert lin.gemms is None, "the linear's own table is put back"


def test_candidates_try_the_current_choice_with_the_other_trigger_place():
    """The current split-K or ring choice comes first, its twin with LATE flipped second (where the
    kernel after it may launch, which paid at 16 rows); cuBLAS has no such twin."""
    x, w = torch.randn(16, 64), torch.randn(64, 64)
    late_ring = {"impl": "ring", "config": dict(RING["config"], LATE=1)}
    assert step_tuning.candidates(RING, 16, x, w, None)[:2] == [RING, late_ring]
    assert step_tuning.candidates(late_ring, 16, x, w, None)[1] == {"impl": "ring", "config": dict(RING["config"], LATE=0)}
    split_k = {"impl": "triton", "config": {"BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 4, "TMA": 1}}
    assert step_tuning.candidates(split_k, 16, x, w, None)[1]["config"] == dict(split_k["config"], LATE=1)
    cublas = {"impl": "cublas", "config": None}
    assert not any((c.get("config") or {}).get("LATE") for c in step_tuning.candidates(cublas, 16, x, w, None))


def test_in_step_refuses_rounds_or_a_margin_it_cannot_use(tmp_path):
    for flags in (("--step-rounds", "0"), ("--step-margin", "1.5"), ("--step-margin", "-0.1")):
        out = tune_gemm("--shape", "llama3-8b", "--in-step", *flags, "--out", str(tmp_path / "t.json"))
        assert out.returncode == 2 and "--step-rounds" in out.stderr and "[0, 1)" in out.stderr, (flags, out.stderr)
    assert not (tmp_path / "t.json").exists()


def test_step_tune_script_names_bad_arguments_before_the_gpu(tmp_path):
    """benchmarks/step_tune.py refuses what the refinement cannot use, naming it, with exit 2 and
    no table written (the checks come before any engine is built)."""
    table = tmp_path / "start.json"
    GemmTable("cpu", {}).save(table)
    cases = [(("--batch", "128"), "--batch 128"), (("--batch", "0"), "--batch 0"),
             (("--linears", "qkv_proj,mlp"), "unknown ['mlp']"), (("--impls", "ring,magic"), "unknown ['magic']"),
             (("--rounds", "0"), "[0, 1)"), (("--margin", "1"), "[0, 1)"),
             (("--attention-config", '{"stages": 1}'), "--attention-config takes a JSON object"),
             (("--attention-config", "[1]"), "--attention-config takes a JSON object")]
    for flags, says in cases:
        out = subprocess.run([sys.executable, "-m", "benchmarks.step_tune", "--gemm-config", str(table),
                              "--out", str(tmp_path / "t.json"), *flags],
                             capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 2 and says in out.stderr, (flags, out.stderr)
    assert not (tmp_path / "t.json").exists()


def test_tune_gemm_names_malformed_batches(tmp_path):
    for batches in ("1,x", "0,16", ""):
        out = tune_gemm("--shape", "llama3-8b", "--batches", batches, "--out", str(tmp_path / "t.json"))
        assert out.returncode == 2 and "--batches" in out.stderr and "e.g. --batches" in out.stderr, (batches, out.stderr)
    assert not (tmp_path / "t.json").exists()


def test_tune_gemm_refuses_an_out_file_it_would_merge_into_that_is_no_good_table(tmp_path):
    """An existing --out takes the new entries. One that is no table, or holds an entry no kernel
    takes, is named before any tuning, and left as it was."""
    for text, says in (("{not json", "is not a `shardline tune-gemm` table"),
                       ('{"gpu": "NVIDIA H200", "entries": {"4096x4096:bfloat16:bfloat16": '
                        '{"64": {"impl": "triton", "config": {"BLOCK_N": 100, "BLOCK_K": 128}}}}}', "BLOCK_N=100")):
        path = tmp_path / "t.json"
        path.write_text(text)
        out = tune_gemm("--shape", "llama3-8b", "--out", str(path))
        assert out.returncode == 2 and f"--out {path} exists" in out.stderr and says in out.stderr, out.stderr
        assert path.read_text() == text


def test_the_12_bit_form_is_a_candidate_for_a_layers_bf16_product_on_hopper(monkeypatch):
    """Only there (the kernel runs a layer's products from bf16 on Hopper, not the head's), with
    K split where its tiles are few (32 tiles of Llama-3-8B's o and down on 132 multiprocessors),
    and a candidate is checked in the 12-bit form itself: _agrees packs the weight for it and puts
    the linear back."""
    from shardline.kernels import _dispatch
    from shardline.kernels.exp12 import EXP12_TILES
    from shardline.model.layers import Linear
    x, w = torch.randn(16, 128).to(torch.bfloat16), (torch.randn(256, 128) * 0.02).to(torch.bfloat16)
    monkeypatch.setattr(_dispatch, "hopper_or_later", lambda t: True)
    exp12 = [c for c in step_tuning.candidates(RING, 16, x, w, None, glu=True, exp12=True) if c["impl"] == "exp12"]
    assert [c["config"] for c in exp12] == EXP12_TILES  # 2 tiles of 128 rows: K's 2 tiles of 64 cannot split 4 ways
    assert not [c for c in step_tuning.candidates(RING, 16, x, w, None, glu=True) if c["impl"] == "exp12"]
    assert not [c for c in step_tuning.candidates(RING, 16, x.float(), w.float(), None, glu=True, exp12=True)
                if c["impl"] == "exp12"]
    down_x, down_w = torch.empty(16, 14336, dtype=torch.bfloat16), torch.empty(4096, 14336, dtype=torch.bfloat16)
    down = [c["config"] for c in step_tuning.candidates(RING, 16, down_x, down_w, None, exp12=True)
            if c["impl"] == "exp12"]
    assert down == [dict(c, SPLIT_K=4) for c in EXP12_TILES]
    monkeypatch.undo()
    lin = Linear(w)
    packed = []
    real = Linear.prepare_exp12
    monkeypatch.setattr(Linear, "prepare_exp12", lambda self, glu, allowed=True: real(self, glu, allowed) or
                        packed.append(self.exp12 is not None))
    assert step_tuning._agrees(lin, exp12[0], 16, torch.bfloat16, glu=True)
    assert packed == [True, False] and lin.gemms is None and lin.exp12 is None
    w[0, :] = 0.0  # 128 zeros in one tile, which K in 2 tiles cannot split to 64 a split: the form packs the weight
    assert not step_tuning._agrees(Linear(w), exp12[0], 16, torch.bfloat16, glu=True)  # but runs no such config
