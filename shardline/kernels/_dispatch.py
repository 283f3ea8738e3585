"""Which implementation a public kernel op runs: the Triton kernel or the torch reference.

The only place the kernels read the environment, once, at import:

    SHARDLINE_DISABLE_TRITON=1   every op runs its `*_ref` (a debugging and bisecting switch)
    SHARDLINE_DISABLE_GLUON=1    no Gluon kernels (the ring GEMM): tables that chose it run the
                                 reference, tune-gemm leaves it out (bisecting a new kernel)
    SHARDLINE_PDL=0              launch decode kernels without programmatic dependent launch
                                 (Hopper and later; on by default there, see triton_pdl.py)
    SHARDLINE_GEMV_PDL=0|1       the CUDA C GEMV's PDL, in every form; unset, its bulk-copy form
                                 takes it and the FFMA and MMA forms do not (PDL made the FFMA
                                 form's batch-1 stack 14-27% slower, the bulk form's faster,
                                 docs/benchmarks-history.md)
    SHARDLINE_FOLD_NORMS=0       decode steps keep their RMSNorm kernels instead of folding the norms
                                 into the products' epilogues (model/transformer.py; the weights are
                                 folded either way): an A/B switch
    SHARDLINE_GEMV_LAYERNORM=0   batch-1 decode leaves LayerNorm layers (GPT-J, GPT-2) to separate
                                 norm, activation and add kernels instead of fusing them into the
                                 GEMVs (model/transformer.py): an A/B switch
    SHARDLINE_TRACE_PROGRAMS=1   the decode GEMMs and attention write every program's timeline
                                 (shardline/kernels/trace.py; a diagnostic for benchmarks/program_trace.py)
    TRITON_INTERPRET=1           Triton's own interpreter switch; with it, CPU tensors take the
                                 Triton path too (slow; lets kernel tests run without a GPU)

Triton is imported lazily and only when a CUDA (or interpreted) tensor arrives, so the CPU build
never needs it; a CUDA machine without Triton quietly runs the references.
"""

from __future__ import annotations

import functools
import logging
import os
import time

import torch

TRITON_DISABLED = os.environ.get("SHARDLINE_DISABLE_TRITON", "0") not in ("", "0")
GLUON_DISABLED = os.environ.get("SHARDLINE_DISABLE_GLUON", "0") not in ("", "0")
TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
PDL_DISABLED = os.environ.get("SHARDLINE_PDL", "1") in ("", "0")
FOLD_NORMS = os.environ.get("SHARDLINE_FOLD_NORMS", "1") not in ("", "0")
GEMV_LAYERNORM = os.environ.get("SHARDLINE_GEMV_LAYERNORM", "1") not in ("", "0")
TRACE_PROGRAMS = os.environ.get("SHARDLINE_TRACE_PROGRAMS", "0") not in ("", "0")
GEMV_PDL_ENABLED = {"": None, "0": False}.get(os.environ.get("SHARDLINE_GEMV_PDL", ""), True)


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def gluon_available() -> bool:
    """Triton's explicit dialect (`triton.experimental.gluon`) with its Hopper ops, for gluon_ring.py."""
    if GLUON_DISABLED:
        return False
    try:
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(x: torch.Tensor) -> bool:
    """True when `x` should be handled by a Triton kernel rather than the reference."""
    if TRITON_DISABLED or not (x.is_cuda or TRITON_INTERPRET):
        return False
    return triton_available()


@functools.cache
def _is_hopper_or_later(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def hopper_or_later(x: torch.Tensor) -> bool:
    """x lives on a GPU of compute capability 9.0 or later."""
    return x.is_cuda and _is_hopper_or_later(x.device.index if x.device.index is not None
                                             else torch.cuda.current_device())


def use_pdl(x: torch.Tensor) -> bool:
    """Launch x's kernel with programmatic dependent launch: it may start while the kernel before
    it drains, and waits for it (gdc_wait) before reading what that kernel wrote."""
    if PDL_DISABLED or TRITON_INTERPRET:
        return False
    return hopper_or_later(x)


def use_gemv_pdl(x: torch.Tensor, form_default: bool) -> bool:
    """`use_pdl` for the CUDA C GEMV: SHARDLINE_GEMV_PDL if set, else the form's default."""
    return (form_default if GEMV_PDL_ENABLED is None else GEMV_PDL_ENABLED) and use_pdl(x)


def pdl_args(x: torch.Tensor) -> dict:
    """Launch arguments of a decode kernel that calls `triton_pdl.pdl_wait(USE_PDL)`."""
    pdl = use_pdl(x)
    return {"USE_PDL": pdl, "launch_pdl": pdl}


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@functools.cache
def num_sms(device_index: int) -> int:
    """Multiprocessors of CUDA device `device_index`; -1 (a CPU tensor: the interpreter or a
    reference, where only grid shapes depend on it) pretends an H200's 132."""
    if device_index < 0 or not torch.cuda.is_available():
        return 132
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(x: torch.Tensor) -> int:
    return num_sms(x.device.index if x.is_cuda and x.device.index is not None else
                   (torch.cuda.current_device() if x.is_cuda else -1))


class CompileLog:
    """Triton's JIT hooks, logging each kernel compiled from now on with the time it took. On a
    replica that serves, a compile is a kernel meeting a shape for the first time, and every
    request on the replica waits for it (about a second: docs/benchmarks.md, session r)."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._started: dict[str, float] = {}

    def before(self, *, key, **_) -> bool:
        self._started[str(key)] = time.perf_counter()
        return False  # compile as usual

    def after(self, *, key, fn=None, compile=None, **_) -> None:
        started = self._started.pop(str(key), None)
        ms = 1e3 * (time.perf_counter() - started) if started is not None else float("nan")
        self.log.warning("compiled a Triton kernel while serving, in %.0f ms (a shape met for the first time; "
                         "this replica's steps waited): %s", ms, describe_specialization(fn, compile or {}))


def describe_specialization(fn, compile: dict) -> str:
    """`kernel(arg: type, arg: type/16, NAME=value, ...)`: what Triton specialized this compile on
    (constants, and `/16` where it assumed an argument divisible by 16), from the `compile` keyword
    its JIT hooks get. (Triton 3.6's own `repr` zips the parameters with the characters of the
    cache key, so it names nothing.)"""
    name = getattr(fn, "name", None) or "kernel"
    signature = compile.get("signature") or {}
    constants = compile.get("constants") or {}
    attrs = (compile.get("configs") or [{}])[0]
    parts = []
    for i, (arg, ty) in enumerate(signature.items()):
        if (i,) in constants:
            parts.append(f"{arg}={constants[(i,)]}")
        else:
            parts.append(f"{arg}: {ty}{'/16' if attrs.get((i,)) else ''}")
    options = ", ".join(f"{k}={compile[k]}" for k in ("num_warps", "num_stages") if k in compile)
    return f"{name}[{options}]({', '.join(parts)})"


def log_compiles(log: logging.Logger) -> CompileLog | None:
    """Log every Triton compile of this process from now on (see CompileLog); None where Triton
    does not run."""
    if TRITON_DISABLED or TRITON_INTERPRET or not triton_available():
        return None
    from triton import knobs

    hooks = CompileLog(log)
    knobs.runtime.jit_cache_hook = hooks.before
    knobs.runtime.jit_post_compile_hook = hooks.after
    return hooks
