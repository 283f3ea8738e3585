"""Programmatic dependent launch for the decode kernels (Hopper and later; `_dispatch.use_pdl`).

A kernel launched with PDL may be scheduled while the kernel before it is still draining; it must
then wait (`gdc_wait`) before it touches anything that kernel writes. Every decode-path kernel
calls `pdl_wait` first and then lets its own successor launch, so at most one kernel waits ahead
and each boundary costs the wait, not a full drain-and-launch. The GEMV goes further: it starts
streaming its weights before the wait (triton_gemv.py).
"""

import triton
import triton.language as tl


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
