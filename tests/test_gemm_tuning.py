"""`shardline tune-gemm`'s table: the engine must pick the tuned choice for the right batch size
and fall back cleanly when the file is missing or from another GPU."""

from __future__ import annotations

import logging

import pytest
import torch

from shardline.gemm_tuning import GemmTable, key, linear_shapes, tune
from shardline.config import ModelConfig
from shardline.model.random_weights import LLAMA3_8B


def table() -> GemmTable:
    t = GemmTable("cpu")
    k = key(4096, 4096, torch.bfloat16, torch.bfloat16)
    t.entries[k] = {1: {"impl": "triton", "config": {"SPLIT_K": 8}}, 64: {"impl": "cublas", "config": None}}
    return t


def test_choice_uses_the_smallest_tuned_batch_at_or_above_m():
    t = table()
    assert t.choice(4096, 4096, torch.bfloat16, torch.bfloat16, 1)["impl"] == "triton"
    assert t.choice(4096, 4096, torch.bfloat16, torch.bfloat16, 16)["impl"] == "cublas"
    assert t.choice(4096, 4096, torch.bfloat16, torch.bfloat16, 65) is None, "above the largest: default path"
    assert t.choice(4096, 1024, torch.bfloat16, torch.bfloat16, 1) is None, "untuned shape: default path"


def test_round_trip_and_fallbacks(tmp_path, caplog):
    path = tmp_path / "gemm.json"
    table().save(path)
    loaded = GemmTable.load(path, torch.device("cpu"))
    assert loaded is not None and loaded.entries == table().entries
    other = GemmTable("NVIDIA H100 80GB HBM3", table().entries)
    other.save(path)
    with caplog.at_level(logging.WARNING):
        assert GemmTable.load(path, torch.device("cpu")) is None
        assert GemmTable.load(tmp_path / "missing.json", torch.device("cpu")) is None
    assert "tuned on" in caplog.text and "not found" in caplog.text


def test_linear_shapes_follow_the_tp_split():
    cfg = ModelConfig(**LLAMA3_8B)
    assert linear_shapes(cfg, 1)["qkv_proj"] == (6144, 4096)
    assert linear_shapes(cfg, 2) == {"qkv_proj": (3072, 4096), "o_proj": (4096, 2048), "up_proj": (14336, 4096),
                                     "down_proj": (4096, 7168), "lm_head": (64128, 4096)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="tuning times kernels on a CUDA GPU")
def test_tune_picks_a_candidate_no_slower_than_cublas():
    t, report = tune({"o_proj": (1024, 1024)}, [1, 16], torch.bfloat16, "none", torch.device("cuda"))
    assert all(r["best_us"] <= r["default_us"] for r in report)
    assert t.choice(1024, 1024, torch.bfloat16, torch.bfloat16, 1) is not None
