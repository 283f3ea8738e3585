"""The GPU's SM clock, power draw and throttle reasons, read now or sampled while a benchmark runs.

A batch-64 decode step holds an H200 at its 700 W board limit, where the driver lowers the SM
clock until the draw fits ("SW power cap"), and how far it lowers it differs from machine to
machine and with what ran just before. So a decode timing is reported with the clock and the draw
it ran at:

    with Sampler() as state:
        run()
    state.summary()  # {"sm_mhz": 1712, "sm_mhz_min": 1530, "power_w": 688.1, "power_capped": 0.93, ...}

The sampling thread wakes 20 times a second (4 through nvidia-smi) beside the benchmark's host
thread. SHARDLINE_GPU_SAMPLER=0 turns the thread off (the summary is then {}), so
`decode_bench.py --env-variants 'SHARDLINE_GPU_SAMPLER=1;SHARDLINE_GPU_SAMPLER=0'` measures what it
costs a step: nothing outside the ±0.03 ms spread at batch 64 on an H100 (5.641 against 5.627 ms,
benchmarks/results/sampler-ab-b64-h100-2026-12-07w3.txt). Readings come from NVML (nvidia-ml-py)
where it imports, else from `nvidia-smi`, both for the current CUDA device, found by the index
NVML gives it (CUDA_VISIBLE_DEVICES mapped back).
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import time
from dataclasses import dataclass

SMI_FIELDS = "clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active"

# NVML's clock event (throttle) reasons, by bit: what `reasons` in a summary names.
REASONS = {0x1: "idle", 0x2: "app clocks", 0x4: "SW power cap", 0x8: "HW slowdown", 0x10: "sync boost",
           0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake", 0x100: "display clocks"}
POWER_CAP = 0x4


@dataclass(frozen=True)
class Reading:
    sm_mhz: float
    power_w: float
    reasons: int  # NVML's bitmask (REASONS)


def _device_index() -> int:
    """The current CUDA device as NVML and nvidia-smi number the GPUs: under CUDA_VISIBLE_DEVICES
    (indices or UUIDs) CUDA's device 0 may be any of them, mapped back as torch.cuda's own NVML
    readings map it; CUDA's index where torch cannot map it."""
    import torch

    index = torch.cuda.current_device()
    try:
        return torch.cuda._get_nvml_device_index(index)
    except Exception:  # a torch without the helper, or NVML without the UUIDs: CUDA's numbering
        return index


def smi() -> str:
    """The GPU's SM and memory clocks, power draw and limit, temperature and throttle reasons now,
    as nvidia-smi prints them (one line for a log)."""
    out = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader", "-i",
                          str(_device_index())], capture_output=True, text=True, check=False)
    return out.stdout.strip() or f"(nvidia-smi: {out.stderr.strip()})"


def parse_smi(line: str) -> Reading | None:
    """`nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader,nounits`'s
    line as a Reading; None for one that is not three numbers ("[N/A]" where a field is unsupported)."""
    try:
        mhz, watts, reasons = (f.strip() for f in line.split(","))
        return Reading(float(mhz), float(watts), int(reasons, 16))
    except ValueError:
        return None


class _Nvml:
    interval = 0.05  # seconds between a Sampler's readings: a library call, no process

    def __init__(self, index: int) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        self.reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def read(self) -> Reading | None:
        n, h = self.nvml, self.handle
        return Reading(float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)), n.nvmlDeviceGetPowerUsage(h) / 1e3,
                       int(self.reasons(h)))


class _Smi:
    interval = 0.25  # a process a reading: asked less often

    def __init__(self, index: int) -> None:
        self.index = str(index)

    def read(self) -> Reading | None:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active",
                              "--format=csv,noheader,nounits", "-i", self.index],
                             capture_output=True, text=True, check=False)
        return parse_smi(out.stdout)


def reader(index: int | None = None):
    """What reads the GPU: NVML where nvidia-ml-py imports and initialises, else nvidia-smi (made
    once a device)."""
    return _reader(_device_index() if index is None else index)


@functools.cache
def _reader(index: int):
    try:
        return _Nvml(index)
    except Exception:  # no nvidia-ml-py, or NVML without this device: the command line still answers
        return _Smi(index)


def read() -> Reading | None:
    """The SM clock, power draw and throttle reasons now; None where they cannot be read."""
    return reader().read()


def summarize(readings: list[Reading]) -> dict:
    """Means of the clock and the draw, the lowest clock, the share of readings at the power cap
    and every reason seen; {} for none."""
    if not readings:
        return {}
    n, seen = len(readings), 0
    for r in readings:
        seen |= r.reasons
    return {"sm_mhz": round(sum(r.sm_mhz for r in readings) / n), "sm_mhz_min": round(min(r.sm_mhz for r in readings)),
            "power_w": round(sum(r.power_w for r in readings) / n, 1),
            "power_capped": round(sum(bool(r.reasons & POWER_CAP) for r in readings) / n, 2),
            "reasons": [name for bit, name in REASONS.items() if seen & bit], "readings": n}


class Sampler:
    """Reads the GPU every `interval` seconds on a thread while the `with` block runs; summary()
    after it. `read` stands in for the GPU's reader (tests give it a fake). Under
    SHARDLINE_GPU_SAMPLER=0 it reads nothing and starts no thread."""

    def __init__(self, read=None, interval: float | None = None) -> None:
        self.enabled = os.environ.get("SHARDLINE_GPU_SAMPLER", "1") != "0"
        if read is None and self.enabled:  # switched off, no reader is made (nor a thread started)
            r = reader()
            read, interval = r.read, interval or r.interval
        self._read, self.interval = read, interval or 0.05
        self.readings: list[Reading] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-state", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            try:
                got = self._read()
            except Exception:  # a failed reading is a missing one, not a failed benchmark
                got = None
            if got is not None:
                self.readings.append(got)
            self._stop.wait(max(0.0, self.interval - (time.perf_counter() - t)))

    def __enter__(self) -> Sampler:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()

    def summary(self) -> dict:
        return summarize(self.readings)
