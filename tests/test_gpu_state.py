"""benchmarks/gpu_state.py: the SM clock, power draw and throttle reasons a decode timing ran at.

CPU: nvidia-smi's lines parsed, readings summarised, the sampler's thread fed by a fake reader,
decode_bench's table with and without the state, the fall back to nvidia-smi without NVML. GPU:
the real reader's numbers."""

import sys
import threading
import time

import pytest
import torch

from benchmarks import gpu_state
from benchmarks.gpu_state import POWER_CAP, Reading, Sampler, parse_smi, summarize


def test_parse_smi_reads_clock_power_and_the_reasons_mask():
    assert parse_smi("1755, 688.42, 0x0000000000000004\n") == Reading(1755.0, 688.42, POWER_CAP)
    assert parse_smi("1980, 151.10, 0x0000000000000000") == Reading(1980.0, 151.1, 0)
    for bad in ("", "[N/A], 688.42, 0x4", "1755, 688.42", "NVIDIA-SMI has failed"):
        assert parse_smi(bad) is None, bad


def test_summarize_means_the_lowest_clock_and_the_share_at_the_power_cap():
    got = summarize([Reading(1980, 650.0, 0), Reading(1600, 699.0, POWER_CAP), Reading(1500, 697.0, POWER_CAP | 0x40),
                     Reading(1700, 690.0, POWER_CAP)])
    assert got == {"sm_mhz": 1695, "sm_mhz_min": 1500, "power_w": 684.0, "power_capped": 0.75,
                   "reasons": ["SW power cap", "HW thermal"], "readings": 4}
    assert summarize([]) == {}


class FakeGpuReader:
    """Stands in for NVML: the sampler's thread is what is under test. Every third call fails, as a
    driver call may; the sampler must pass over it."""

    def __init__(self):
        self.calls = 0
        self.threads = set()

    def __call__(self):
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.calls % 3 == 0:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return Reading(1500.0 + self.calls, 700.0, POWER_CAP)


def test_sampler_reads_on_its_own_thread_while_the_block_runs_and_stops_after():
    fake = FakeGpuReader()
    with Sampler(read=fake, interval=0.01) as s:
        time.sleep(0.2)
    calls = fake.calls
    time.sleep(0.05)
    assert fake.calls == calls  # stopped with the block
    assert calls >= 5 and fake.threads == {"gpu-state"}
    assert len(s.readings) == calls - calls // 3  # the failed calls are missing readings, nothing more
    summary = s.summary()
    assert summary["power_capped"] == 1.0 and summary["sm_mhz_min"] == 1501 and summary["readings"] == len(s.readings)


def test_reader_falls_back_to_nvidia_smi_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    gpu_state._reader.cache_clear()
    r = gpu_state.reader(index=0)
    gpu_state._reader.cache_clear()
    assert isinstance(r, gpu_state._Smi) and r.index == "0" and r.interval >= 0.2


def test_decode_table_prints_the_gpu_state_beside_each_row(capsys):
    from benchmarks.decode_bench import print_table
    state = summarize([Reading(1650, 695.0, POWER_CAP)])
    res = {"gpu": "NVIDIA H200", "date": "2026-12-06", "torch": "2.11", "command": "decode_bench.py --batches 64,1",
           "shardline": [{"batch": 64, "decode_ms_per_step": 4.6, "tok_s": 13913.0, "graph_replay_ms": 4.5,
                          "gpu_state": state},
                         {"batch": 1, "decode_ms_per_step": 3.7, "tok_s": 270.3, "graph_replay_ms": 3.6}]}
    print_table(res, 0)
    lines = capsys.readouterr().out.splitlines()
    header = next(l for l in lines if l.lstrip().startswith("batch"))
    assert header.split()[-3:] == ["MHz", "W", "capped"]
    row64 = next(l for l in lines if l.split()[:2] == ["64", "4.600"])
    assert row64.split()[-3:] == ["1650", "695", "100%"]
    row1 = next(l for l in lines if l.split()[:2] == ["1", "3.700"])  # a row of an older run: no state
    assert row1.split()[-3:] == ["nan", "nan", "nan%"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="reads a CUDA GPU's clock and power; the CPU tests feed "
                    "the sampler a fake reader")
def test_the_gpu_reader_gives_a_clock_and_a_draw_while_the_gpu_works():
    r = gpu_state.read()
    assert r is not None and 100 < r.sm_mhz < 5000 and 0 < r.power_w < 2000
    a = torch.randn(4096, 4096, device="cuda")
    with Sampler() as s:
        for _ in range(50):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        time.sleep(0.3)
    assert s.summary()["readings"] >= 1 and s.summary()["sm_mhz"] > 100


def test_sampler_switched_off_starts_no_thread_and_reads_nothing(monkeypatch):
    monkeypatch.setenv("SHARDLINE_GPU_SAMPLER", "0")
    fake = FakeGpuReader()
    before = {t.name for t in threading.enumerate()}
    with Sampler(read=fake, interval=0.01) as s:
        time.sleep(0.05)
        assert "gpu-state" not in {t.name for t in threading.enumerate()} - before
    assert fake.calls == 0 and s.summary() == {}
    with Sampler() as s:  # nor is a GPU reader made: this runs on a machine without one
        pass
    assert s.summary() == {}


def test_the_device_is_read_by_its_nvml_index_under_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # CUDA's device 1 is the machine's GPU 5
    assert gpu_state._device_index() == 5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert gpu_state._device_index() == 0  # nothing visible to map: CUDA's own index, no error
