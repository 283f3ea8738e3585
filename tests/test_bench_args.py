"""The benchmarks' list options reject malformed values with the expected form (CPU)."""

import argparse
import json

import pytest
import torch

from benchmarks.arguments import decode_shapes


def test_decode_shapes_parses_pairs_and_names_the_form_on_bad_input():
    assert decode_shapes("64x192,1x2048") == [(64, 192), (1, 2048)]
    for bad in ("64by192", "64x", "0x192", "64x192x3", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="BATCHxCONTEXT pairs"):
            decode_shapes(bad)


def test_prefetch_depths_parse_and_name_the_form_on_bad_input():
    from benchmarks.arguments import depths
    assert depths("0,1,8") == [0, 1, 8]
    for bad in ("1,x", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="tile counts >= 0"):
            depths(bad)


def test_gemm_configs_takes_existing_tables_and_names_the_missing(tmp_path):
    from benchmarks.decode_bench import table_paths
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("{}")
    b.write_text("{}")
    assert table_paths(f"{a},{b}") == [str(a), str(b)]
    with pytest.raises(argparse.ArgumentTypeError, match="not found: .*c.json"):
        table_paths(f"{a},{tmp_path / 'c.json'}")
    with pytest.raises(argparse.ArgumentTypeError, match="got none"):
        table_paths(",")


def test_batch_lists_parse_and_name_the_form_on_bad_input():
    from benchmarks.decode_bench import batch_list
    assert batch_list("1,16,64") == [1, 16, 64]
    for bad in ("", "1,", "0,16", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="batch sizes >= 1"):
            batch_list(bad)


def test_env_variants_parse_and_name_the_form_on_bad_input():
    from benchmarks.decode_bench import env_variants, without_option
    assert env_variants("SHARDLINE_FOLD_NORMS=1;SHARDLINE_FOLD_NORMS=0") == [{"SHARDLINE_FOLD_NORMS": "1"},
                                                                              {"SHARDLINE_FOLD_NORMS": "0"}]
    assert env_variants("A=1,B=x=y;A=0") == [{"A": "1", "B": "x=y"}, {"A": "0"}]
    for bad in ("A=1", "A=1;", "A=1;B", "=1;A=0", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="two or more environments"):
            env_variants(bad)
    argv = ["--batches", "64", "--env-variants", "A=1;A=0", "--env-rounds=3", "--skip", "int8"]
    assert without_option(without_option(argv, "--env-variants"), "--env-rounds") == ["--batches", "64", "--skip", "int8"]


def test_env_variants_alternate_fresh_runs_and_summarise_each_batch(monkeypatch, capsys):
    """The A/B's orchestration, its child process replaced by a fake that records the environment
    and returns rows as decode_bench prints them."""
    from benchmarks import decode_bench
    calls = []

    def fake_child(cmd, env=None, timeout=600):
        calls.append((cmd[2:], env))
        on = env["SHARDLINE_FOLD_NORMS"] == "1"
        state = {"sm_mhz": 1700 + 10 * len(calls), "power_w": 690.0} if on else {}  # as a run without readings
        return [{"batch": 64, "decode_ms_per_step": (4.8 if on else 4.9) + 0.01 * len(calls), "gpu_state": state},
                {"gpu": "x", "shardline": []}]
    monkeypatch.setattr(decode_bench, "run_json_lines", fake_child)
    decode_bench.run_env_variants([{"SHARDLINE_FOLD_NORMS": "1"}, {"SHARDLINE_FOLD_NORMS": "0"}], 2,
                                  ["--batches", "64", "--env-variants", "x", "--env-rounds", "2"])
    assert [env["SHARDLINE_FOLD_NORMS"] for _, env in calls] == ["1", "0", "1", "0"]
    assert all(args == ["--batches", "64"] for args, _ in calls)
    out = capsys.readouterr().out
    assert "SHARDLINE_FOLD_NORMS=1" in out and "4.810 / 4.830  mean 4.820  1,720 MHz 690 W" in out
    assert "SHARDLINE_FOLD_NORMS=0" in out and "4.920 / 4.940  mean 4.930\n" in out


def test_attention_resources_names_a_bad_register_cap_before_compiling():
    pytest.importorskip("triton", reason="benchmarks/attention_resources.py imports Triton to compile")
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "benchmarks.attention_resources", "--maxnreg", "5"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "--maxnreg 5: registers a thread, from 24 to 255" in out.stderr, out.stderr[-500:]


def test_split_k_resources_hold_a_tma_tile_a_stage_and_name_a_bad_tile():
    """The split-K kernel compiled for sm_90 at the batch-64 gate/up entry and at its 256-row twin
    (session b): shared memory is the stages' TMA tiles (gate, up and x) and their barriers, nothing spills; a
    malformed --tile is a usage error."""
    pytest.importorskip("triton", reason="benchmarks/splitk_resources.py compiles with Triton")
    import subprocess
    import sys
    from benchmarks.gemv_registers import _ptxas
    from benchmarks.splitk_resources import compile_split_k
    for bn, bk, warps, stages in ((128, 128, 4, 4), (256, 64, 8, 4)):
        kernel = compile_split_k(bn, bk, 1, warps, stages)
        regs, spills = _ptxas(kernel.asm["ptx"])
        tile_bytes = (bn * bk + 64 * bk) * 2  # gate + up rows, then x's 64 rows, bf16
        barriers = kernel.metadata.shared - stages * tile_bytes  # the TMA loads' mbarriers
        assert 0 <= barriers < 1024 and spills == 0 and regs <= 255, (bn, kernel.metadata.shared, regs, spills)
    out = subprocess.run([sys.executable, "-m", "benchmarks.splitk_resources", "--tile", "128,128"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "BLOCK_N,BLOCK_K,SPLIT_K,num_warps,num_stages" in out.stderr, out.stderr[-500:]


def test_resident_programs_take_the_least_of_registers_shared_memory_and_slots():
    pytest.importorskip("triton", reason="benchmarks/attention_resources.py compiles with Triton")
    from benchmarks.attention_resources import resident
    assert resident(38 * 1024, 123, 4) == 4  # 128 registers a thread: 4 x 16K of the 64K
    assert resident(38 * 1024, 165, 4) == 3  # 168 a thread: registers hold three
    assert resident(100 * 1024, 64, 4) == 2  # shared memory holds two
    assert resident(0, 16, 1) == 32  # block slots


def test_decode_bench_names_bad_attention_tiles_and_block_sizes_before_the_gpu():
    """A tile key the kernel does not take, or a cache block that is no power of two, is a usage
    error (exit 2, the option named) before any engine is built."""
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "decode_bench.py"
    table = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gemm-h200-decode.json"
    cases = [(["--attention-configs", '[{}, {"stages": 1}]'], "--attention-configs takes a JSON list"),
             (["--attention-configs", '[{}, {"splits": 3}]'], "splits=3: a power of two"),
             (["--attention-configs", '[{}, {"EARLY_KV": 1}]'], "EARLY_KV=1: true or false"),
             (["--attention-configs", '[{"OPAQUE_BT": "yes"}]'], "OPAQUE_BT='yes': true or false"),
             (["--attention-configs", '[{}, {"LATE": 1}]'], "LATE=1: true or false"),
             (["--gemm-configs", f"{table},{table}", "--attention-configs", '[{}]'], "pair up"),
             (["--block-size", "48"], "--block-size 48: a power of two"),
             (["--ab-rounds", "0"], "--ab-rounds must be >= 1"),
             (["--gptj-batches", "0"], "batch sizes >= 1"),
             (["--batches", "64,x"], "batch sizes >= 1"),
             (["--skip", "lama,int8"], "--skip lama,int8: unknown ['lama']")]
    for flags, says in cases:
        out = subprocess.run([sys.executable, str(script), "--batches", "64", *flags],
                             capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 2 and says in out.stderr, (flags, out.stderr[-500:])


def test_ring_resources_reads_the_launch_register_cap_from_the_compiled_kernel():
    """Compiled for sm_90 on the CPU: uncapped, the ring asks for the whole register file (255 a
    thread for 256 threads); capped at 128 it asks for half, so another program fits beside it."""
    pytest.importorskip("triton.experimental.gluon", reason="benchmarks/ring_resources.py compiles Gluon")
    from benchmarks.gemv_registers import _ptxas
    from benchmarks.ring_resources import compile_ring
    regs = {cap: _ptxas(compile_ring(64, 128, 4, 1, False, "none", cap).asm["ptx"])[0] for cap in (0, 128)}
    assert regs == {0: 255, 128: 128}, regs


def test_decode_attention_tiles_pipeline_only_with_block_ids_unseen():
    """Compiled for sm_90 on the CPU: with the block ids read by tl.load, three stages leave the
    K/V tiles one buffer each, waited for whole (cp.async.wait_group 0) before the math; read by
    inline PTX (OPAQUE_BT), the same three stages give them two buffers, one tile in flight during
    the math (wait_group 2: the K and V copies of the next tile)."""
    pytest.importorskip("triton", reason="compiling the decode attention for sm_90 needs Triton")
    import re

    from benchmarks.attention_resources import compile_decode
    seen, unseen = (compile_decode(3, 64, 4, opaque_bt=o) for o in (False, True))
    waits = {name: set(re.findall(r"cp\.async\.wait_group\s+(\d+)", k.asm["ptx"])) for name, k in
             (("seen", seen), ("unseen", unseen))}
    tile = 64 * 128 * 2  # one K (or V) tile of 64 tokens, bf16
    assert waits["seen"] == {"0"} and seen.metadata.shared < 3 * tile, (waits, seen.metadata.shared)
    assert "2" in waits["unseen"] and unseen.metadata.shared >= 4 * tile, (waits, unseen.metadata.shared)


def test_step_power_names_a_bad_batch_before_the_gpu():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "benchmarks.step_power", "--batch", "0"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 2 and "--batch 0" in out.stderr, out.stderr[-500:]


def test_step_power_names_missing_tables_and_bad_rounds_before_the_gpu(tmp_path):
    import subprocess
    import sys
    table = tmp_path / "t.json"
    table.write_text("{}")
    for argv, want in ((["--gemm-configs", f"{table},{tmp_path}/gone.json"], "gone.json"),
                       (["--gemm-configs", str(table), "--rounds", "0"], "--rounds 0")):
        out = subprocess.run([sys.executable, "-m", "benchmarks.step_power", *argv], capture_output=True,
                             text=True, timeout=120, check=False)
        assert out.returncode == 2 and want in out.stderr, out.stderr[-500:]


def test_replay_spacing_names_a_bad_batch_before_the_gpu():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "benchmarks.replay_spacing", "--batch", "0"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 2 and "--batch 0" in out.stderr, out.stderr[-500:]


def test_profile_decode_names_a_bad_attention_config_before_the_gpu():
    """Not JSON, or keys the decode kernel does not take: exit 2 naming the option (one parser,
    decode_bench.parse_attention_config, serves step_tune's option too)."""
    import subprocess
    import sys
    for text in ("{bad", '{"stages": 1}', '{"OPAQUE_BT": 1}', '{"FUSE_ROTARY": "no"}'):
        out = subprocess.run([sys.executable, "-m", "benchmarks.profile_decode", "--attention-config", text],
                             capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 2 and "--attention-config takes a JSON object" in out.stderr, (text, out.stderr[-500:])


def test_profile_decode_names_bad_contexts_before_the_gpu():
    """--contexts needs --timeline and two distinct contexts >= 1: exit 2 naming the option."""
    import subprocess
    import sys
    for argv in (["--contexts", "1,256"], ["--timeline", "--contexts", "192"], ["--timeline", "--contexts", "0,192"],
                 ["--timeline", "--contexts", "a,b"], ["--timeline", "--contexts", "64,64"]):
        out = subprocess.run([sys.executable, "-m", "benchmarks.profile_decode", *argv],
                             capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 2 and "--contexts" in out.stderr and "at least two" in out.stderr, (argv, out.stderr[-500:])


A_B_BAD_ARGUMENTS = {
    "logits_store_ab": ((["--batch", "1"], "--batch 1"), (["--rounds", "0"], "--rounds 0"), ([], "CUDA GPU")),
    "kv_dtype_ab": ((["--cases", "64x4000"], "must fit 4,096 positions"), (["--cases", "64"], "BATCHxPROMPT"),
                    (["--rounds", "0"], "--rounds 0"), ([], "CUDA GPU")),
    "graph_boundary": ((["--steps", "1"], "each >= 2"), (["--steps", "a"], "--steps 'a'"), (["--rounds", "0"], "--rounds 0"),
                       (["--context", "0"], "--context 0"), ([], "CUDA GPU")),
}


@pytest.mark.parametrize("module", sorted(A_B_BAD_ARGUMENTS))
def test_the_a_bs_name_bad_arguments_before_the_gpu(module):
    import subprocess
    import sys
    for argv, names in A_B_BAD_ARGUMENTS[module]:
        out = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *argv],
                             capture_output=True, text=True, timeout=120, check=False)
        if not argv and "CUDA GPU" not in out.stderr:
            continue  # a machine with a GPU gets past the check
        assert out.returncode == 2 and names in out.stderr, (argv, out.stderr[-500:])


def test_decode_bench_sizes_the_kv_pool_for_the_shape():
    """GPT-J's 256 sequences of a 128 + 128 run need ~30 GB of KV (0.46 MB a token); the bench gave
    every model 24 GB, and GPT-J's batch 256 failed with OutOfBlocks (session o)."""
    from benchmarks.decode_bench import kv_bytes_for
    gptj = kv_bytes_for("gptj-6b", 256)
    assert gptj >= 256 * 257 * 28 * 2 * 16 * 256 * 2 > 24 << 30
    assert kv_bytes_for("llama3-8b", 256) == 24 << 30, "Llama's 8.6 GB fits the old floor"


@pytest.mark.parametrize("argv,names", [(["--batch", "0"], "--batch 0"),
                                        (["--only", "qkv_proj,gate"], "unknown ['gate']"),
                                        (["--configs", "[{BLOCK_M: 128}]"], "--configs takes a JSON list"),
                                        (["--configs", '{"BLOCK_M": 128}'], "--configs takes a JSON list of objects")])
def test_large_m_bench_names_bad_arguments_before_the_gpu(argv, names):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "benchmarks.large_m_bench", *argv], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 2 and names in out.stderr, out.stderr[-500:]


def test_table_variant_replaces_one_entry_and_names_a_bad_set(tmp_path, capsys):
    """benchmarks/table_variant.py: the copy differs from the table in the entry set, and a --set
    that names no linear, no batch or no JSON entry is a usage error saying the form."""
    from benchmarks import table_variant
    base = {"gpu": "NVIDIA H200", "entries": {"4096x4096:bfloat16:bfloat16": {"16": {"impl": "cublas", "config": None},
                                                                            "64": {"impl": "cublas", "config": None}}}}
    src, out = tmp_path / "t.json", tmp_path / "v.json"
    src.write_text(json.dumps(base))
    entry = {"impl": "ring", "config": {"BLOCK_N": 128, "BLOCK_K": 128, "STAGES": 4, "SPLIT_K": 4}}
    table_variant.main(["--gemm-config", str(src), "--set", f"o_proj@64={json.dumps(entry)}",
                        "--set", 'qkv_proj@16={"impl": "cublas", "config": null}', "--out", str(out)])
    got = json.loads(out.read_text())
    assert got["gpu"] == "NVIDIA H200"
    assert got["entries"]["4096x4096:bfloat16:bfloat16"] == {"16": {"impl": "cublas", "config": None}, "64": entry}
    assert got["entries"]["6144x4096:bfloat16:bfloat16"] == {"16": {"impl": "cublas", "config": None}}
    for bad, says in (("o@64={}", "LINEAR@BATCH=JSON"), ("o_proj@0={}", "positive integer"),
                      ("o_proj@64={nope", "not JSON"), ('o_proj@64={"config": {}}', '"impl"')):
        with pytest.raises(SystemExit):
            table_variant.main(["--gemm-config", str(src), "--set", bad, "--out", str(out)])
        assert says in capsys.readouterr().err
    table_variant.main(["--gemm-config", str(src), "--gpu", "NVIDIA H100 80GB HBM3", "--out", str(out)])
    assert json.loads(out.read_text()) == dict(base, gpu="NVIDIA H100 80GB HBM3"), "the same choices, for that card"
    with pytest.raises(SystemExit):
        table_variant.main(["--gemm-config", str(src), "--out", str(out)])
    assert "--set LINEAR@BATCH=JSON (repeatable), --gpu NAME, or both" in capsys.readouterr().err


def test_dram_timeline_weights_each_sample_by_its_overlap(capsys):
    """benchmarks/dram_timeline.py: a stretch's DRAM rate is the samples' mean weighted by how much
    of each sample interval lies inside it (the per-kernel column), None outside every sample; and a
    bad --batch is a usage error before anything is built."""
    from benchmarks import dram_timeline
    times, values = [0, 10, 20, 30], [90.0, 10.0, 50.0, 0.0]
    assert dram_timeline.mean_over(times, values, 0, 20) == pytest.approx(50.0)
    assert dram_timeline.mean_over(times, values, 5, 15) == pytest.approx(50.0)  # half of each of two samples
    assert dram_timeline.mean_over(times, values, 15, 20) == pytest.approx(10.0)
    assert dram_timeline.mean_over(times, values, 40, 50) is None
    with pytest.raises(SystemExit):
        dram_timeline.main(["run", "--batch", "0"])
    assert "--batch 0" in capsys.readouterr().err
    # Without Nsight Compute the module is what is missing; with it, the report.
    with pytest.raises(SystemExit, match="needs Nsight Compute's ncu_report|missing.ncu-rep does not exist"):
        dram_timeline.load("missing.ncu-rep")


def test_chain_bench_kernel_builds_for_sm90_with_its_waits_and_fences():
    """benchmarks/chain_bench.py's boundary-spanning kernel compiles for Hopper on a CPU: qkv's x
    waits on an acquire load of down's counter (or its tiles' flags) and crosses to the async proxy
    (TMA) by a fence; down's tiles are published the same way."""
    pytest.importorskip("triton.experimental.gluon", reason="the chained kernel is written in Gluon")
    from benchmarks import chain_bench
    for flags in (False, True):
        ptx = chain_bench.compile_for_sm90(tile_flags=flags, backoff=True).asm["ptx"]
        assert "ld.global.gpu.acquire" in ptx and "fence.proxy.async.global" in ptx and "nanosleep" in ptx
        assert ("atom.global.gpu.release.exch" in ptx) == flags, "tiles publish by flag only with tile_flags"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="the chained kernel needs a Hopper GPU (wgmma, TMA)")
@pytest.mark.parametrize("form", [{}, {"tile_flags": True, "backoff": True}])
def test_chain_bench_matches_the_two_ring_kernels_bit_for_bit(form):
    """The chained kernel's two products equal the engine's two ring kernels exactly (same tiles,
    same K order, the same split sum), twice in a row (its counters reset themselves)."""
    from benchmarks import chain_bench
    torch.manual_seed(0)
    xa = torch.randn(40, 2048, device="cuda", dtype=torch.bfloat16)
    wa = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16) * 0.02
    wb = torch.randn(1536, 1024, device="cuda", dtype=torch.bfloat16) * 0.02
    for _ in range(2):
        got, want = chain_bench.chain(xa, wa, wb, **form), chain_bench.two_kernels(xa, wa, wb)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_dram_timeline_report_charges_each_kernel_from_the_previous_end(capsys):
    """dram_timeline.report on a made-up step of two layers (samples 10 µs apart; the data ncu's
    report would give `load`): each kernel kind's stretch runs from the previous kernel's end to its
    own, its DRAM rate is the stretch's weighted mean, and the time below the steady rate (the
    samples' 90th percentile, here 100%) adds up to what the step loses."""
    from benchmarks import dram_timeline
    names = ["embed", "qkv", "attn", "o", "up", "down", "qkv", "attn", "o", "up", "down"]
    ends = [1000 * e for e in (10, 30, 40, 50, 70, 80, 100, 110, 120, 140, 150)]  # ns
    kernels = [(n, 0, e) for n, e in zip(names, ends)]
    times = list(range(0, 160_000, 10_000))
    # DRAM idles in the samples that start at 30, 80, 100 and 150 µs, else it reads at 100%.
    values = [0.0 if t in (30_000, 80_000, 100_000, 150_000) else 100.0 for t in times]
    series = {label: (times, values) for label in dram_timeline.SERIES}
    dram_timeline.report(series, kernels, layer=0)
    out = capsys.readouterr().out
    assert "11 kernels, 150.0 us" in out and "steady rate (the samples' 90th percentile) 100.0%" in out
    rows = {line.split()[0] + " < " + line.split()[2]: line.split() for line in out.splitlines() if " < " in line
            and not line.startswith("kernel")}
    # attention after qkv: its stretches [30, 40) and [100, 110) are both idle samples
    assert rows["attn < qkv"][3:4] == ["2"] and float(rows["attn < qkv"][6]) == 0.0
    # qkv after down: [80, 100) half idle at its start, [10, 30) after embed is busy
    assert float(rows["qkv < down"][6]) == pytest.approx(50.0)
    # lost: attention's two idle stretches (10 µs each) and the second qkv's idle half (10 µs)
    assert "below the steady rate: 30.0 us of the step; at that rate throughout, 120.0 us" in out
    assert "layer 0: its samples" in out and out.rstrip().splitlines()[-1].endswith("down")


def test_stage0_streams_bench_reads_every_token_both_ways(tmp_path):
    """benchmarks/stage0_streams.py on the real stage servicer (a paced fake worker under it):
    each form delivers every token of every sequence, and the figures it compares are there."""
    import subprocess
    import sys

    out = tmp_path / "streams.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.stage0_streams", "--streams", "4", "--step-ms", "2",
                        "--new", "8", "--rounds", "1", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())["rounds"]
    assert [row["mode"] for row in rows] == ["generate", "many"]
    # (CPU time comes in 10 ms clock ticks: at 32 tokens it may read 0)
    assert all(row["tokens"] == 32 and row["server_cpu_us_per_token"] >= 0 and row["tok_s"] > 0 for row in rows)


def test_the_late_key_moves_the_successors_launch_after_the_main_loop():
    """Compiled for sm_90 on the CPU: the ring GEMM and decode attention let the next kernel launch
    right after their PDL wait, before any product; with LATE only after their last one."""
    pytest.importorskip("triton.experimental.gluon", reason="benchmarks/ring_resources.py compiles Gluon")
    from benchmarks.attention_resources import compile_decode
    from benchmarks.ring_resources import compile_ring

    def trigger_and_products(ptx: str) -> tuple[list[int], list[int]]:
        lines = ptx.splitlines()
        return ([i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line],
                [i for i, line in enumerate(lines) if "mma" in line and not line.lstrip().startswith("//")])

    for name, build in (("ring", lambda late: compile_ring(64, 128, 4, 1, False, "none", late=late)),
                        ("attention", lambda late: compile_decode(2, 64, 4, late=late))):
        for late in (False, True):
            triggers, products = trigger_and_products(build(late).asm["ptx"])
            assert len(triggers) == 1 and products, (name, late, triggers)
            if late:
                assert triggers[0] > products[-1], f"{name}: with LATE the trigger must follow the loop's last product"
            else:
                assert triggers[0] < products[0], f"{name}: by default the trigger must come before any product"
