"""`shardline generate` is the quick look a user takes at a converted model: it must run every
stage and TP rank and print exactly the generated ids as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shardline.converter import convert
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import generate_local
from shardline.tiny import make_tiny_hf_model


@pytest.fixture(scope="module")
def model_tp2_pp2(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    hf = make_tiny_hf_model(root / "hf", "gptj")
    convert(hf, root / "model", tp=2, pp=2, dtype="fp32")
    return root / "model"


def shardline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardline.cli", *args], capture_output=True, text=True, timeout=300)


def test_generate_prints_json_token_ids(model_tp2_pp2):
    r = shardline("generate", "--model", str(model_tp2_pp2), "--prompt-ids", "1,5,9", "--max-tokens", "6",
                  "--temperature", "0.9", "--seed", "3", "--ignore-eos", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    expected = generate_local(model_tp2_pp2, [[1, 5, 9]],
                              SamplingParams(temperature=0.9, seed=3, max_tokens=6, ignore_eos=True))[0]
    assert out == {"token_ids": expected}


@pytest.mark.parametrize("args,needle", [
    (["--prompt-ids", "1,x"], "comma-separated integers"),
    (["--prompt-ids", "1,99999"], "outside the vocabulary"),
    (["--prompt-ids", "1", "--temperature", "-1"], "temperature"),
    (["--prompt-ids", "1", "--kv-cache-dtype", "int4"],
     "--kv-cache-dtype 'int4' is not a KV-cache type; use auto (the model's dtype) or fp8"),
])
def test_generate_bad_input(model_tp2_pp2, args, needle):
    r = shardline("generate", "--model", str(model_tp2_pp2), *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr


@pytest.mark.timeout(120)
def test_tp_ranks_that_fail_before_a_result_are_reported(tmp_path, model_tp2_pp2):
    """Rank 1's shard is corrupt: it dies loading it, rank 0 when its peer is gone, and the parent
    says so instead of waiting forever."""
    import shutil

    from shardline.config import EngineConfig

    broken = tmp_path / "broken"
    shutil.copytree(model_tp2_pp2, broken)
    shard = next(broken.glob("stage-0/rank-1.safetensors"))
    shard.write_bytes(b"garbage!" + shard.read_bytes()[8:])
    with pytest.raises(RuntimeError, match=r"TP ranks exited with codes \[1, 1\] before returning a result"):
        generate_local(broken, [[1, 5, 9]], SamplingParams(max_tokens=2), EngineConfig(num_blocks=64))


@pytest.mark.timeout(120)  # the bug this guards against is a deadlock
def test_a_result_larger_than_a_pipe_comes_back(model_tp2_pp2):
    """Logits of a 200-token prompt, far beyond a pipe's 64 KB buffer: the parent reads the result
    while the ranks are alive, so the driver does not block sending it."""
    from shardline.config import EngineConfig
    from shardline.stage_worker.pipeline import run_local

    prompt = [1 + i % 200 for i in range(200)]
    (logits,) = run_local(model_tp2_pp2, [("logits", (prompt,))], EngineConfig(num_blocks=64))
    assert logits.shape[0] == len(prompt) and logits.numel() * 4 > 1 << 16
