"""scripts/gpu-tests.sh, the GPU suite's command: on a machine without CUDA it says so and exits 2
(it must not pass by skipping everything), and its two runs between them cover every GPU test once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-tests.sh"


def test_without_cuda_it_refuses_rather_than_skipping_everything():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run the GPU suite")
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "PYTHON": sys.executable})
    assert out.returncode == 2, out.stdout[-500:] + out.stderr[-500:]
    assert "no CUDA device" in out.stderr and "scripts/test.sh" in out.stderr, out.stderr


def collected(args: list[str]) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "gpu", "-p", "no:cacheprovider",
                          *args], capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_its_two_runs_cover_every_gpu_test_once():
    """The tests the script spreads (SPREAD_TESTS, read from it) and the rest (`tests` with each of
    them ignored, as its second run says) collect disjoint sets whose union is `-m gpu tests`."""
    text = SCRIPT.read_text()
    spread = re.search(r"^SPREAD_TESTS=\((.+)\)$", text, re.M).group(1).split()
    assert '"${SPREAD_TESTS[@]/#/--ignore=}"' in text, "the second run must ignore what the first spreads"
    first = collected(spread)
    second = collected(["tests", *(f"--ignore={t}" for t in spread)])
    every = collected(["tests"])
    assert first and second and not first & second, "a GPU test would run twice, or a run collects nothing"
    assert first | second == every, sorted(every - first - second)[:10]
