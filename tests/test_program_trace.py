"""benchmarks/program_trace.py's reading of kernel timelines (on made-up records: the GPU part
runs on the H200), and the traced kernels' build for sm_90."""

import pytest
import torch

from benchmarks.program_trace import by_kernel, format_table, summarise, timer_tick_ns
from shardline.kernels.trace import FIELDS


def records(rows):
    """[programs, FIELDS] int64 from (start, waited, first, loop_end, exit, sm) tuples in us."""
    return torch.tensor([[int(v * 1000) if i < 5 else v for i, v in enumerate(r)] for r in rows], dtype=torch.int64)


def test_each_launch_is_measured_against_the_last_exit_of_the_one_before():
    a = records([(0, 1, 2, 10, 11, 0), (0, 1, 3, 12, 14, 1)])  # last exit 14
    b = records([(9, 15, 16, 30, 31, 2), (13, 16, 17, 31, 35, 3), (14, 15.5, 0, 29, 32, 2)])
    rows = summarise([("qkv", a), ("attention", b)])
    first, second = rows
    assert first["critical"] == pytest.approx(14) and first["lead"] == 0 and first["programs"] == 2
    assert second["critical"] == pytest.approx(21)  # 35 - 14
    assert second["lead"] == pytest.approx(5)  # its first program started at 9, 5 us before a's last exit
    assert second["release"] == pytest.approx(1)  # first wait returned at 15
    assert second["landed"] == pytest.approx(1)  # median of 1 and 1 (the third program has no first-tile stamp)
    assert second["loop"] == pytest.approx(15)  # median of 15, 15, 13.5
    assert second["tail"] == pytest.approx(3)  # 35 - median exit 32
    assert second["sms"] == 2
    # Started 1 us or more before a's last exit (14): the one at 9 (5 us); the one at 13 (1 us) too;
    # the one at 14 not. The first launch has nothing ahead of it.
    assert second["early"] == pytest.approx(2 / 3) and first["early"] == 0
    assert first["TB/s"] is None and first["a program"] is None  # no bytes given
    rated = summarise([("qkv", a)], {"qkv": 26_000_000})
    # 26 MB from the first wait (1 us) to the last exit (14 us): 2 TB/s; 13 MB a program over the
    # median program's wait to exit (10 and 13 us: 11.5) is 1130 GB/s.
    assert rated[0]["TB/s"] == pytest.approx(2.0) and rated[0]["a program"] == pytest.approx(13e6 / 11.5e3)


def test_kernels_are_averaged_by_label_leaving_out_the_layers_at_the_ends():
    launches = []
    for layer in range(8):
        base = 100 * layer
        launches.append(("ring 6144x4096", records([(base, base + 1, base + 2, base + 9, base + 10 + layer, 0)])))
        launches.append(("attention", records([(base + 10 + layer, base + 20, 0, base + 29, base + 30, 1)])))
    kernels = by_kernel(summarise(launches))
    assert [k["kernel"] for k in kernels] == ["ring 6144x4096", "attention"]
    ring, attention = kernels
    assert ring["launches"] == 8 and attention["launches"] == 8
    # The ring's exits come `layer` us late, so attention's critical time is 20 - layer; layers 1..6
    # are averaged (the first and last left out): 20 - 3.5.
    assert ring["loop"] == pytest.approx(8) and attention["critical"] == pytest.approx(16.5)
    table = format_table(kernels)
    assert table.splitlines()[0].split()[:4] == ["kernel", "launches", "programs", "SMs"]
    assert table.splitlines()[1].split()[-2:] == ["-", "-"]  # no rates without bytes
    assert "attention" in table and len(table.splitlines()) == 3


def test_the_timer_tick_is_the_smallest_step_between_stamps():
    assert timer_tick_ns([("k", records([(0, 1, 2, 3, 5, 0)]))]) == 1000
    assert len(FIELDS) == 6


def test_traced_kernels_compile_for_sm90_with_a_timer_read_per_stamp():
    """The ring GEMM and decode attention with TRACE: one %globaltimer read a stamp (the ring's
    exit has two, its split path returning early) and the multiprocessor at exit; without it, none."""
    pytest.importorskip("triton.experimental.gluon", reason="benchmarks/ring_resources.py compiles Gluon")
    from benchmarks.attention_resources import compile_decode
    from benchmarks.ring_resources import compile_ring
    for traced in (False, True):
        ring = compile_ring(64, 128, 4, 2, False, "res", trace=traced).asm["ptx"]
        attention = compile_decode(2, 64, 4, trace=traced).asm["ptx"]
        assert (ring.count("%globaltimer"), ring.count("%smid")) == ((6, 2) if traced else (0, 0))
        assert (attention.count("%globaltimer"), attention.count("%smid")) == ((4, 1) if traced else (0, 0))


def test_bad_arguments_are_named_before_the_gpu():
    import subprocess
    import sys
    for flags, says in ((["--batch", "0"], "--batch 0"), (["--gemm-config", "a.json", "--gemm-configs", "b.json"],
                                                           "not both"), (["--shape", "nope"], "--shape nope"),
                        (["--attention-configs", '[{"NEW_FIRST": 1}]'], "NEW_FIRST=1: true or false"),
                        (["--attention-configs", '[{"stages": 2}]'], "keys from"),
                        (["--gemm-configs", "a.json,b.json", "--attention-configs", "[{}]"], "pair one to one")):
        out = subprocess.run([sys.executable, "-m", "benchmarks.program_trace", *flags], capture_output=True,
                             text=True, timeout=120, check=False)
        assert out.returncode == 2 and says in out.stderr, (flags, out.stderr[-500:])


def test_a_saved_layer_splits_into_waves_with_their_ramps_loops_and_rates(tmp_path):
    import json
    import subprocess
    import sys

    from benchmarks.program_trace import read, waves
    # Two programs start at once; a third starts after the first exit (8 us): the second wave.
    recs = [[0, 1000, 1500, 7500, 8000, 0], [0, 1000, 1600, 8600, 9000, 1], [8500, 8600, 9000, 13000, 13200, 0]]
    first, second = waves("ring 1000x300", recs, sms=132)
    assert (first["wave"], first["programs"], second["wave"], second["programs"]) == (1, 2, 2, 1)
    assert first["ramp"] == pytest.approx(0.55) and first["loop"] == pytest.approx(6.5)
    assert first["epilogue"] == pytest.approx(0.45) and second["epilogue"] == pytest.approx(0.2)
    # 600 KB over 3 programs, 200 KB in a median loop of 6.5 us, times the wave's 2 programs.
    assert first["TB/s"] == pytest.approx(200_000 / 6500 * 2 / 1e3)
    assert waves("attention", recs)[0]["TB/s"] is None, "no weight bytes in an attention label"
    saved = tmp_path / "t.json"
    saved.write_text(json.dumps({"gpu": "G", "date": "D", "command": "c", "traces": [
        {"table": "T", "replay_ms": 4.6, "middle_layer_records": {"80: ring 1000x300": recs}}]}))
    text = read(str(saved), 132)
    assert "T: replay 4.600 ms" in text and len([ln for ln in text.splitlines() if ln.startswith("ring")]) == 2
    out = subprocess.run([sys.executable, "-m", "benchmarks.program_trace", "--read", str(tmp_path / "none.json")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "--read" in out.stderr and "program_trace --out" in out.stderr, out.stderr[-300:]
