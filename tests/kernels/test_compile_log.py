"""A replica says when it compiles a Triton kernel while serving, naming the kernel and the time."""

from __future__ import annotations

import inspect
import types
import logging

import pytest

from shardline.kernels._dispatch import CompileLog


def test_a_compile_is_logged_with_its_kernel_specialization_and_time(caplog):
    hooks = CompileLog(logging.getLogger("test.compiles"))
    # Triton 3.6's JITFunction._call_hook passes these keywords to both hooks; `compile` holds the
    # signature by name, the constants and the attributes (divisibility) by argument index.
    compile = {"signature": {"q_ptr": "*bf16", "num_seqs": "i32", "stride": "i32", "BLOCK_Q": "constexpr"},
               "constants": {(3,): 32}, "configs": [{(0,): [["tt.divisibility", 16]],
                                                     (2,): [["tt.divisibility", 16]]}],
               "num_warps": 4, "num_stages": 3}
    call = dict(key="[('*bf16', 'D'), ('i32', ''), ('i32', 'D')]", repr="garbled",
                fn=types.SimpleNamespace(name="_prefill_kernel"), compile=compile, is_manual_warmup=False,
                already_compiled=False)
    with caplog.at_level(logging.WARNING, logger="test.compiles"):
        assert hooks.before(**call) is False, "the cache hook must not skip the compile"
        hooks.after(**call)
    (record,) = caplog.records
    message = record.getMessage()
    assert ("_prefill_kernel[num_warps=4, num_stages=3](q_ptr: *bf16/16, num_seqs: i32, stride: i32/16, "
            "BLOCK_Q=32)") in message
    assert " ms " in message and "nan" not in message


def test_the_hooks_take_what_this_tritons_call_hook_passes():
    """Triton calls hook(key=, repr=, fn=, compile=, is_manual_warmup=, already_compiled=), with
    `compile` holding 'signature', 'constants' and 'configs' (CompileLog describes those): if a
    Triton upgrade renames them, this fails here rather than on a serving replica."""
    jit = pytest.importorskip("triton.runtime.jit", reason="Triton is not installed")
    source = inspect.getsource(jit.JITFunction._call_hook)
    for field in ("'signature': signature", "'constants': constants", "'configs': configs"):
        assert field in source, f"Triton's _call_hook no longer passes {field} in `compile`"
    for keyword in ("key=key", "fn=JitFunctionInfo(", "compile={", "is_manual_warmup=", "already_compiled="):
        assert keyword in source, f"Triton's _call_hook no longer passes {keyword}"
