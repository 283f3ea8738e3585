"""Programmatic dependent launch for the decode kernels (Hopper and later; `_dispatch.use_pdl`).

A kernel launched with PDL may be scheduled while the kernel before it is still draining; it must
then wait (`gdc_wait`) before it touches anything that kernel writes. Every decode-path kernel
calls `pdl_wait` first and then lets its own successor launch, so at most one kernel waits ahead
and each boundary costs the wait, not a full drain-and-launch. The GEMV goes further: it starts
streaming its weights before the wait (triton_gemv.py); the small-M and stream-K GEMMs ask L2
for their first weight tiles there (`prefetch_l2`).

Where a kernel lets its successor launch is the config key LATE of the split-K, ring and decode
attention kernels: right after the wait (the default) or once every program has left its main loop
(`pdl_trigger_late`). Each moves single boundaries by 12-62 us a step at batch 64, both ways, and
no placement gained there in whole runs; at 16 rows attention, o and gate/up late together gained
~0.02 ms a step (docs/benchmarks.md).
"""

import triton
import triton.language as tl

from . import trace


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr, LATE: tl.constexpr = False):
    """Wait for the kernel ahead, then let the kernel after this one launch, unless LATE: then
    `pdl_trigger_late` does where this kernel's main loop ends."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if not LATE:
            tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_trigger_late(USE_PDL: tl.constexpr, LATE: tl.constexpr):
    if USE_PDL:
        if LATE:
            tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the lines at `ptrs` (one pointer per 128-byte line); nothing comes back. A kernel
    launched with PDL calls it on weights, which no earlier kernel writes, before its wait."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


# shardline/kernels/trace.py's FIELDS, as the kernels name them (the indices are trace.py's).
T_START = tl.constexpr(trace.START)
T_WAITED = tl.constexpr(trace.WAITED)
T_FIRST = tl.constexpr(trace.FIRST)
T_LOOP_END = tl.constexpr(trace.LOOP_END)
T_EXIT = tl.constexpr(trace.EXIT)
T_SM = tl.constexpr(trace.SM)
T_WORDS = tl.constexpr(len(trace.FIELDS))


@triton.jit
def trace_stamp(trace_ptr, program, FIELD: tl.constexpr, TRACE: tl.constexpr):
    """shardline/kernels/trace.py: this program's FIELD word, the time now (at T_START also T_FIRST's 0: these
    kernels have no first-tiles stamp; at T_EXIT also its multiprocessor)."""
    if TRACE:
        tl.store(trace_ptr + program * T_WORDS + FIELD, tl.extra.cuda.globaltimer())
        if FIELD == T_START:
            tl.store(trace_ptr + program * T_WORDS + T_FIRST, 0)
        if FIELD == T_EXIT:
            tl.store(trace_ptr + program * T_WORDS + T_SM, tl.extra.cuda.smid().to(tl.int64))
