"""The arithmetic of the GPU probes in benchmarks/, checked on CPU: the launch-cost line fit, the
tile packing the weight-layout probe indexes, and the bytes the read floor reads a step."""

from __future__ import annotations

import pytest
import torch


def test_launch_cost_fit_recovers_the_fixed_cost_and_the_rate():
    from benchmarks.launch_cost_bench import fit
    points = [(nbytes, 4.5 + nbytes / 4.2e6) for nbytes in (3e7, 6e7, 1.2e8, 2.4e8)]  # us, at 4,200 GB/s
    fixed, rate = fit(points)
    assert fixed == pytest.approx(4.5) and rate == pytest.approx(4200.0)


def test_weight_layout_pack_puts_tile_n_kb_at_its_rows():
    pytest.importorskip("triton", reason="the probe module defines its Triton kernel at import")
    from benchmarks.weight_layout_bench import pack
    bn, bk = 4, 8
    w = torch.arange(12 * 32, dtype=torch.float32).view(12, 32)
    packed = pack(w, bn, bk)
    kt = 32 // bk
    assert packed.shape == (12 * 32 // bk, bk)
    for n in range(12 // bn):
        for kb in range(kt):
            rows = slice((n * kt + kb) * bn, (n * kt + kb + 1) * bn)
            assert torch.equal(packed[rows], w[n * bn:(n + 1) * bn, kb * bk:(kb + 1) * bk])


@pytest.mark.parametrize("shape", ["llama-small", "gptj-small"])
def test_read_floor_reads_the_steps_weights_once_and_its_kv_cache(shape):
    """The shadow step streams the weights the engine's step streams (decode_bench's count, on a
    small random engine built on CPU), once, plus batch x context tokens of K and V a layer."""
    from benchmarks.decode_bench import num_params
    from benchmarks.read_floor import step_reads
    from shardline import step_tuning
    from shardline.config import ModelConfig
    from shardline.model.random_weights import SHAPES
    from shardline.stage_worker.pipeline import LocalPipeline
    cfg = ModelConfig(**SHAPES[shape])
    reads = step_reads(cfg, batch=8, context=40)
    assert len(reads) == 5 * cfg.num_layers + 1 and reads[-1][0] == "head"
    kv = sum(n for name, n in reads if name == "attention KV")
    assert kv == cfg.num_layers * 8 * 40 * cfg.num_kv_heads * cfg.head_dim * 2 * 2
    engine = step_tuning.random_engine(cfg, "bf16", "none", 8, "cpu", kv_bytes=1 << 20, max_model_len=256)
    _, weight_bytes = num_params(LocalPipeline(None, config=engine.config, engines=[engine]))
    assert sum(n for _, n in reads) - kv == weight_bytes


def test_tma_l2_promotion_patches_the_one_descriptor_fill_of_the_installed_triton():
    """The probe's copy of Triton reads the promotion from the environment at the one place the
    driver fills a descriptor, and says which Triton it does not know rather than run unpatched."""
    triton = pytest.importorskip("triton", reason="the probe patches the installed Triton's driver")
    from pathlib import Path

    from benchmarks.tma_l2_promotion import ENV, patch_driver_source
    src = (Path(triton.__file__).parent / "backends" / "nvidia" / "driver.c").read_text()
    patched = patch_driver_source(src)
    assert "CU_TENSOR_MAP_L2_PROMOTION_L2_128B, fill);" not in patched
    assert patched.count(f'getenv("{ENV}")') == 2 and len(patched) > len(src)
    with pytest.raises(RuntimeError, match="not 1"):
        patch_driver_source(patched)


@pytest.mark.parametrize("argv, named", [(["--batch", "0"], "--batch 0"), (["--gemm-config", "no-such.json"],
                                                                          "no-such.json: no such file")])
def test_tma_l2_promotion_names_a_bad_argument_and_exits_2(argv, named):
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "benchmarks.tma_l2_promotion", *argv], capture_output=True, text=True)
    assert done.returncode == 2 and named in done.stderr
