"""`shardline up` refuses bad flags in one line, exit 2, before it starts or writes anything."""

from __future__ import annotations

import tempfile

import pytest

from shardline.cli import main


@pytest.mark.parametrize("flags,message", [
    (["--replicas", "0"], "--replicas 0 must be >= 1"),
    (["--tp", "0"], "--tp 0 must be >= 1"),
    (["--pp", "-1"], "--pp -1 must be >= 1"),
    (["--grpc-port", "70000"], "--grpc-port 70000 must be in 0..65535"),
    (["--http-port", "-1"], "--http-port -1 must be in 0..65535"),
    (["--gateways", "0"], "--gateways 0 must be >= 1"),
    (["--gateways", "3", "--grpc-port", "65534"], r"--grpc-port (+ 2 for --gateways 3) 65536 must be in 0..65535"),
])
def test_bad_flags_exit_2_before_anything_starts(tmp_path, monkeypatch, capsys, flags, message):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the cluster's workdir would go
    assert main(["up", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"shardline up: error: {message}") and captured.err.count("\n") == 1
    assert captured.out == "", "nothing is started, so nothing says it is starting"
    assert list(tmp_path.iterdir()) == [], "no work directory for a refused run"


@pytest.mark.parametrize("device,message", [
    ("tpu", "--device 'tpu' is not a device; use cpu, cuda or cuda:N"),
    ("mps", "--device 'mps': shardline runs on cpu or cuda (cuda:N)"),
])
def test_a_device_shardline_does_not_run_on_is_refused(capsys, device, message):
    assert main(["up", "--device", device]) == 2
    assert capsys.readouterr().err == f"shardline up: error: {message}\n"


def test_cuda_without_a_visible_gpu_is_refused(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible here; the check is for machines without one")
    assert main(["up", "--device", "cuda"]) == 2
    assert "--device cuda but no CUDA GPU is visible here" in capsys.readouterr().err


def test_a_gemm_config_that_is_no_file_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["up", "--gemm-config", str(tmp_path / "gemm-h2OO.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"shardline up: error: --gemm-config {tmp_path / 'gemm-h2OO.json'}: no such file; "
                          "give a table written by `shardline tune-gemm --out`"), err
    assert list(tmp_path.iterdir()) == [], "no work directory for a refused run"


def test_a_gemm_config_that_is_no_table_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    bad = tmp_path / "notes.json"
    bad.write_text('{"gpu": "NVIDIA H200"}')
    assert main(["up", "--gemm-config", str(bad)]) == 2
    assert list((tmp_path / "tmp").iterdir()) == [], "no work directory for a refused run"
    err = capsys.readouterr().err
    assert err.startswith(f"shardline up: error: GEMM config {bad} is not a `shardline tune-gemm` table"), err
    assert "re-run `shardline tune-gemm --out` or leave the GEMM config out" in err
