"""Compiling and launching CUDA C kernels from Python: NVRTC for PTX on any machine (the CPU
tests), CuPy for a loaded CUfunction on the GPU, and the driver's `cuLaunchKernelEx` for the
launch (CuPy's own launcher cannot set programmatic dependent launch). Used by cuda_gemv.py.
"""

from __future__ import annotations

import ctypes
import functools


def compile_ptx(source: str, arch: str = "compute_90") -> str:
    """`source`'s PTX from NVRTC, with no GPU needed; NVRTC from the nvidia-cuda-nvrtc wheel or the
    system."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    _check_nvrtc(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None),
                 "nvrtcCreateProgram")
    try:
        opts = [b"-std=c++17", b"--gpu-architecture=" + arch.encode()]
        err = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        if err != 0:
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC could not compile the kernel:\n{log.value.decode()}")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        _check_nvrtc(lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@functools.cache
def _nvrtc():
    import ctypes.util
    import glob
    import os
    candidates = []
    try:
        import nvidia.cuda_nvrtc
        for root in nvidia.cuda_nvrtc.__path__:
            candidates += sorted(glob.glob(os.path.join(root, "lib", "libnvrtc.so.*")))
    except ImportError:
        pass
    try:  # CUDA 13's wheels: nvidia/cu13/lib
        import nvidia
        for root in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(root, "cu*", "lib", "libnvrtc.so.*")))
    except ImportError:
        pass
    candidates += [c for c in (ctypes.util.find_library("nvrtc"),) if c]
    try:  # CuPy's own NVRTC, loaded by its path: then its soname below resolves to it
        from cupy_backends.cuda.libs import nvrtc as cupy_nvrtc
        cupy_nvrtc.getVersion()
    except Exception:  # noqa: BLE001 (no CuPy, or it has no NVRTC: the other candidates)
        pass
    candidates += ["libnvrtc.so.13", "libnvrtc.so.12"]
    for path in candidates:
        if ".alt." not in path:
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    raise ImportError("NVRTC not found: pip install nvidia-cuda-nvrtc-cu12 (no GPU needed)")


def _check_nvrtc(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what} failed with nvrtcResult {err}")


_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


@functools.cache
def load_module(source: str, device_index: int):
    """`source` compiled for `device_index`: a cupy.RawModule (cached per process and on disk)."""
    import cupy
    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=source, options=("-std=c++17",))
        module.compile()
    return module


@functools.cache
def load_function(source: str, name: str, device_index: int, max_dynamic_shared: int = 0) -> int:
    """The CUfunction `name` of `source` compiled for `device_index` (`load_module`), allowed
    `max_dynamic_shared` bytes of dynamic shared memory."""
    import cupy
    with cupy.cuda.Device(device_index):
        kernel = load_module(source, device_index).get_function(name)
        function = getattr(kernel, "kernel", kernel).ptr  # CuPy 14 hands out a RawKernel around it
    if max_dynamic_shared:
        _check(_driver().cuFuncSetAttribute(ctypes.c_void_p(function), _MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            max_dynamic_shared), "cuFuncSetAttribute")
    return function


@functools.cache
def load_ptx_function(ptx: str, name: str, device_index: int, max_dynamic_shared: int = 0) -> int:
    """The CUfunction `name` of `ptx` (compile_ptx's), loaded by the driver into `device_index`'s
    primary context: for a target CuPy does not pick for the device, such as sm_90a, whose
    cluster multicast copies the plain sm_90 target runs slower."""
    import torch
    torch.cuda.init()
    with torch.cuda.device(device_index):
        torch.empty(1, device="cuda")  # the primary context current on this thread
        lib = _driver()
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        _check(lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(ptx.encode())), "cuModuleLoadData")
        _check(lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), "cuModuleGetFunction")
    if max_dynamic_shared:
        _check(lib.cuFuncSetAttribute(function, _MAX_DYNAMIC_SHARED_SIZE_BYTES, max_dynamic_shared),
               "cuFuncSetAttribute")
    return function.value


_BF16, _FP16 = 9, 6  # CU_TENSOR_MAP_DATA_TYPE_*
_SWIZZLE_128B, _L2_PROMOTION_128B = 3, 2


def tensor_map(t, box_rows: int, box_cols: int) -> ctypes.Array:
    """A 2-D TMA descriptor (CUtensorMap, 128 bytes) over the row-major 16-bit matrix `t`: boxes of
    box_rows x box_cols elements, shared memory in 128-byte swizzle (box_cols * 2 == 128 bytes);
    passed by value to a kernel that takes a `const __grid_constant__` 128-byte struct."""
    import torch
    if t.dim() != 2 or t.dtype not in (torch.bfloat16, torch.float16) or t.stride(1) != 1:
        raise ValueError(f"tensor_map: a row-major 2-D bf16 or fp16 matrix, not {t.dtype} of strides {t.stride()}")
    if box_cols * 2 != 128 or not 1 <= box_rows <= 256:
        raise ValueError(f"tensor_map: box {box_rows} x {box_cols}: 64 columns (128-byte swizzle), 1-256 rows")
    desc = (ctypes.c_uint64 * 16)()
    dims = (ctypes.c_uint64 * 2)(t.shape[1], t.shape[0])
    strides = (ctypes.c_uint64 * 1)(t.stride(0) * 2)
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    unit = (ctypes.c_uint32 * 2)(1, 1)
    _check(_driver().cuTensorMapEncodeTiled(desc, _BF16 if t.dtype == torch.bfloat16 else _FP16, 2,
                                             ctypes.c_void_p(t.data_ptr()), dims, strides, box, unit, 0,
                                             _SWIZZLE_128B, _L2_PROMOTION_128B, 0), "cuTensorMapEncodeTiled")
    return desc


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what} failed with CUresult {err}")


class _LaunchAttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_uint64 * 8), ("flag", ctypes.c_int)]


class _LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttrValue)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


@functools.cache
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
    lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return lib


def launch(function: int, grid: int, block: int, shared: int, stream: int, args: list, pdl: bool) -> None:
    """Launch `function` on `stream` (captured into a CUDA graph when the stream is capturing).
    `args` are ctypes values in the kernel's parameter order; `pdl` sets programmatic stream
    serialization, so the kernel may start before the one ahead of it ends."""
    attr = _LaunchAttr(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value.flag = 1
    config = _LaunchConfig(grid, 1, 1, block, 1, 1, shared, stream, ctypes.pointer(attr), 1 if pdl else 0)
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    _check(_driver().cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(function), params, None),
           f"cuLaunchKernelEx (grid {grid}, block {block}, {shared} B shared)")
