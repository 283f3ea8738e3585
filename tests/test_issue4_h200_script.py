"""benchmarks/issue4_h200.sh's refusals, run on CPU. The script spends a device call on issue 4's open H200
numbers; on any other GPU, or none, it must stop at once with status 3 and a reason, before it installs,
writes or times anything, so the machine can be given back with little lost."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def issue4_h200(tmp_path: Path, path_first: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "GPU_NAME"}, "OUT": str(tmp_path / "out"), **env}
    if path_first is not None:
        env["PATH"] = f"{path_first}:{env['PATH']}"
    return subprocess.run(["bash", "benchmarks/issue4_h200.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_an_h100_is_refused_before_anything_is_installed(tmp_path):
    out = issue4_h200(tmp_path, GPU_NAME="NVIDIA H100 80GB HBM3")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "this GPU is 'NVIDIA H100 80GB HBM3', not an H200" in out.stderr
    assert "Give the machine back" in out.stderr
    assert list((tmp_path / "out").iterdir()) == [], "nothing may be written on a GPU it refuses"


def test_no_gpu_is_refused_with_the_fix(tmp_path):
    """nvidia-smi that names no GPU (a stand-in script, first on PATH) and no GPU_NAME."""
    bin_dir = tmp_path / "fake_nvidia_smi_bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\n# a stand-in: a machine whose nvidia-smi finds no GPU\nexit 9\n")
    fake.chmod(0o755)
    out = issue4_h200(tmp_path, path_first=bin_dir)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "no GPU found" in out.stderr and "set GPU_NAME" in out.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_a_cap_that_is_no_whole_number_is_refused_before_anything_runs(tmp_path):
    """A cap goes to `timeout`, where 0 means no cap and a bad value fails each part on its own; the script
    takes whole seconds (0 skips a part) and stops on anything else, on the H200 too, before installing."""
    for bad in ("2m", "-5", "1.5"):
        out = issue4_h200(tmp_path, GPU_NAME="NVIDIA H200", AB_S=bad)
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"AB_S='{bad}' is no whole number of seconds" in out.stderr and "0 to skip" in out.stderr
        assert list((tmp_path / "out").iterdir()) == []
