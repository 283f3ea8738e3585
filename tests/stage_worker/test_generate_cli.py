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
])
def test_generate_bad_input(model_tp2_pp2, args, needle):
    r = shardline("generate", "--model", str(model_tp2_pp2), *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr
