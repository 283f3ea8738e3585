"""What every CUDA graph capture in shardline needs around it."""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def collected_garbage():
    """No garbage collection inside a CUDA graph capture: collect first, then hold the collector off.

    torch.cuda.graph no longer collects before it captures, and its capture is global: a CUDA call
    that is unsafe during a capture, made by any thread, invalidates it. The collector can run at any
    allocation inside the capture, and a dead cycle it frees (an engine dropped a moment before, with
    its pinned buffers, streams and events) can make such calls from its destructors. The suspected
    cause of an H200 failure of the first capture of a new engine ("operation failed due to a
    previous error during capture"), in a test that had just dropped an engine that sampled at a
    temperature (session x; see tests/stage_worker/test_gpu_engine.py)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
