"""A replica says when it compiles a Triton kernel while serving, naming the kernel and the time."""

from __future__ import annotations

import inspect
import logging

import pytest

from shardline.kernels._dispatch import CompileLog


def test_a_compile_is_logged_with_its_kernel_and_time(caplog):
    hooks = CompileLog(logging.getLogger("test.compiles"))
    # Triton's JITFunction._call_hook passes these keywords to both hooks.
    call = dict(key=("sig", (1, 16)), repr="_prefill_kernel[num_warps=4](B: i32, SEQS_P2: constexpr=2)", fn=None,
                compile={}, is_manual_warmup=False, already_compiled=False)
    with caplog.at_level(logging.WARNING, logger="test.compiles"):
        assert hooks.before(**call) is False, "the cache hook must not skip the compile"
        hooks.after(**call)
    (record,) = caplog.records
    assert "_prefill_kernel" in record.getMessage() and "SEQS_P2: constexpr=2" in record.getMessage()
    assert " ms " in record.getMessage() and "nan" not in record.getMessage()


def test_the_hooks_take_what_this_tritons_call_hook_passes():
    """Triton calls hook(key=, repr=, fn=, compile=, is_manual_warmup=, already_compiled=): if a
    Triton upgrade renames them, this fails here rather than on a serving replica."""
    jit = pytest.importorskip("triton.runtime.jit", reason="Triton is not installed")
    source = inspect.getsource(jit.JITFunction._call_hook)
    for keyword in ("key=key", "repr=repr", "is_manual_warmup=", "already_compiled="):
        assert keyword in source, f"Triton's _call_hook no longer passes {keyword}"
