"""benchmarks/multicast_probe.py: its walk kernel compiles for sm_90a on any machine (NVRTC), each
variant with the copies it names; the timing itself needs a Hopper GPU."""

import pytest
import torch

from benchmarks import multicast_probe as probe


@pytest.fixture(scope="module")
def compile_ptx():
    from shardline.kernels import cuda_runtime
    try:
        cuda_runtime._nvrtc()
    except ImportError as e:
        pytest.skip(f"no NVRTC on this machine: {e}")
    return lambda **v: cuda_runtime.compile_ptx(probe.source(32, 6, **v), "compute_90a")


def test_each_variant_compiles_with_the_copies_it_names(compile_ptx):
    ptx = {name: compile_ptx(**v) for name, v in probe.VARIANTS.items()}
    assert all(".target sm_90a" in p for p in ptx.values())
    assert ".multicast::cluster" in ptx["mcast 2"] and ".multicast::cluster" in ptx["mcast 4"]
    assert not any(".multicast::cluster" in ptx[v] for v in ("weights", "x", "cluster 2"))
    # Clustered programs: the cluster's shape in the kernel, a barrier across it, remote arrives.
    assert ".reqnctapercluster 2" in ptx["cluster 2"] and ".reqnctapercluster 4" in ptx["mcast 4"]
    assert "barrier.cluster" in ptx["mcast 2"] and "mapa.shared::cluster" in ptx["mcast 2"]
    assert "barrier.cluster" not in ptx["x"] and "barrier.cluster" not in ptx["split 2"]
    # The split's sum in the cluster: async stores into the other program's shared memory.
    assert "st.async.shared::cluster" in ptx["split 2, DSMEM sum"] and "st.async" not in ptx["split 2"]
    # Only the variants with x copy more than the weights' rows.
    assert ptx["weights"].count("cp.async.bulk") < ptx["x"].count("cp.async.bulk")


def test_a_multicast_needs_x_and_a_cluster_that_divides_its_rows():
    with pytest.raises(ValueError, match="mcast needs x"):
        probe.source(32, 6, X=1, CLUSTER=1, MCAST=1)
    with pytest.raises(ValueError, match="mcast needs x"):
        probe.source(32, 6, X=0, CLUSTER=2, MCAST=1)
    with pytest.raises(ValueError, match="DSMEM sum"):
        probe.source(64, 6, X=1, CLUSTER=1, MCAST=0, KSPLIT=2, DSUM=1)


def test_the_ring_beside_the_walks_is_the_tables_tile():
    # o, qkv and down run the ring at 64 rows in the H200 table; gate/up's entry is split-K
    assert probe.ring_config("o") == {"SUB": 16, "BLOCK_K": 128, "STAGES": 6, "WAVES": 1}
    assert probe.ring_config("down")["SPLIT_K"] == 2
    assert probe.ring_config("gate/up") is probe.RING_GATE_UP


def test_stages_fit_the_shared_memory_the_walk_asks_for():
    for n, k, bn, stages in probe.PRODUCTS.values():
        assert n % (bn * 4) == 0 and k % probe.BK == 0  # whole clusters of 4, whole stages
        assert probe.stage_bytes(bn, 1) * 2 <= 220 * 1024


def test_every_variant_assembles_for_sm90a_without_spills(compile_ptx, tmp_path):
    import shutil
    import subprocess
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("no ptxas on this machine (the CUDA toolkit's)")
    from shardline.kernels import cuda_runtime
    for name, v in probe.VARIANTS.items():
        for bn in (32, 64, 128):
            src = tmp_path / "walk.ptx"
            src.write_text(cuda_runtime.compile_ptx(probe.source(bn, 4, **v), "compute_90a"))
            done = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(src), "-o", str(tmp_path / "walk.cubin")],
                                  capture_output=True, text=True)
            if "Unsupported .version" in done.stderr:
                pytest.skip(f"this ptxas is older than NVRTC's PTX: {done.stderr.strip().splitlines()[0]}")
            assert done.returncode == 0, done.stderr
            assert "0 bytes spill stores" in done.stderr, (name, bn, done.stderr)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="the walk's TMA boxes and clusters need a Hopper GPU")
@pytest.mark.parametrize("product", ["o", "qkv", "gate/up"])
def test_the_products_match_torch_with_x_per_program_and_multicast(product):
    operands = probe._operands(product)
    for variant in (name for name, v in probe.VARIANTS.items() if v.get("MATH")):
        if probe.VARIANTS[variant].get("KSPLIT", 1) > 1 and product not in probe.SPLIT_ROWS:
            continue  # no split band for this product
        us, err = probe.walk_us(product, variant, 2, operands)
        assert us > 0 and err < 1e-2, (variant, err)
