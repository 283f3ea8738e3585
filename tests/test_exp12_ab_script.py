"""benchmarks/exp12_ab.sh's tables, run on CPU (INSTALL=0, TESTS=0, AB=0: no wheels, GPU or timing). A device call
spent on a wrong table is hard to get back, so the part that writes the variants is checked here: each variant
is its base with the named products in the 12-bit form, relabelled to the GPU it runs on, and a variant that
equals its base (session w's first H100 call A/B'd the H100 table against itself) is named as an A/A."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"


def exp12_ab(tmp_path: Path, work: Path, **env: str) -> subprocess.CompletedProcess:
    """The script with GPU_NAME, WORK, OUT and this interpreter's PATH set, and `env` over them."""
    env = {**os.environ, "GPU_NAME": H100, "WORK": str(work), "OUT": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    return subprocess.run(["bash", "benchmarks/exp12_ab.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def run_script(tmp_path: Path, base: str, tables: str) -> subprocess.CompletedProcess:
    out = exp12_ab(tmp_path, tmp_path / "work", INSTALL="0", TESTS="0", AB="0", BASE=base, TABLES=tables)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out


def changed(a: dict, b: dict) -> dict:
    """{(shape, batch): b's entry} for each table entry that differs between a and b."""
    return {(shape, batch): entry for shape, row in b["entries"].items() for batch, entry in row.items()
            if a["entries"].get(shape, {}).get(batch) != entry}


def test_the_h200_table_relabelled_gets_gate_up_then_down_in_exp12(tmp_path):
    out = run_script(tmp_path, "benchmarks/results/gemm-h200-decode.json", "base up ud4")
    assert "A/A" not in out.stderr, out.stderr
    base, up, ud4 = (json.loads((tmp_path / f"{t}.json").read_text()) for t in ("base", "up", "ud4"))
    assert base["gpu"] == up["gpu"] == ud4["gpu"] == H100
    source = json.loads((ROOT / "benchmarks/results/gemm-h200-decode.json").read_text())
    assert not changed(source, base), "relabelling must change nothing but the GPU"
    (key, entry), = changed(base, up).items()
    assert key[1] == "64" and entry["impl"] == "exp12" and "SPLIT_K" not in entry["config"], (key, entry)
    (key2, entry2), = changed(up, ud4).items()
    assert key2[1] == "64" and key2 != key and entry2["impl"] == "exp12" and entry2["config"]["SPLIT_K"] == 4


def test_a_variant_that_is_its_base_is_named_an_a_a(tmp_path):
    """The H100 table has gate/up and down in exp12 at 64 already."""
    out = run_script(tmp_path, "benchmarks/results/gemm-h100-decode.json", "base up ud4")
    for t in ("up", "ud4"):
        assert f"exp12_ab.sh: {t} is BASE itself (benchmarks/results/gemm-h100-decode.json" in out.stderr, out.stderr


@pytest.mark.parametrize("bad, says", [
    ({"TABLES": "base upp"}, "TABLES names 'upp', which is no table; name some of: base up"),
    ({"BASE": "benchmarks/results/gemm-h300-decode.json"}, "BASE=benchmarks/results/gemm-h300-decode.json is no file"),
])
def test_bad_input_is_refused_before_anything_runs(tmp_path, bad, says):
    out = exp12_ab(tmp_path, tmp_path, INSTALL="1", TESTS="1", **bad)
    assert out.returncode == 2, out.stdout + out.stderr
    assert says in out.stderr, out.stderr
    assert not list(tmp_path.iterdir()), "nothing is installed, tested or written before the check"
