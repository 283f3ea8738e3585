"""scripts/gpu-tests.sh, the GPU suite's command: on a machine without CUDA it says so and exits 2
(it must not pass by skipping everything), and its two runs between them cover every GPU test once."""

from __future__ import annotations

import os
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



def test_without_shardline_installed_it_names_the_install(tmp_path):
    """A GPU machine's own Python (no virtualenv) finds ./shardline but not shardline.stage_worker, which
    only the install maps to services/stage-worker/: the script says how to install rather than failing each
    test."""
    bare = tmp_path / "python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")  # no site-packages, so no install
    bare.chmod(0o755)
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "PYTHON": str(bare)})
    assert out.returncode == 2, out.stdout[-500:] + out.stderr[-500:]
    assert "cannot import shardline's packages" in out.stderr and "pip install --no-build-isolation" in out.stderr, \
        out.stderr

def collected(args: list[str]) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "gpu", "-p", "no:cacheprovider",
                          *args], capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_its_two_runs_cover_every_gpu_test_once():
    """The paths of its two runs (`--print-runs`) collect disjoint sets whose union is `-m gpu
    tests`, and the second names only files that hold GPU tests: collecting all of `tests` on the
    H200 failed on the chart tests' import of the Helm engine, which GPU machines lack."""
    out = subprocess.run(["bash", str(SCRIPT), "--print-runs"], capture_output=True, text=True, timeout=60,
                         check=True)
    spread, rest = (line.split() for line in out.stdout.splitlines())
    assert rest and all(Path(ROOT / p).is_file() and "mark.gpu" in (ROOT / p).read_text() for p in rest), rest
    assert not any(p.startswith("tests/chart") for p in rest), rest
    first, second, every = collected(spread), collected(rest), collected(["tests"])
    assert first and second and not first & second, "a GPU test would run twice, or a run collects nothing"
    assert first | second == every, sorted(every - first - second)[:10]
