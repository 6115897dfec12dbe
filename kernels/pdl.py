"""Programmatic dependent launch (PDL, sm_90+) for the decode kernels: the matvecs, the decode
attention (RoPE + KV store, attention) and the MoE decode kernels.

A decode step is ~200 (8B) to ~600 (30B-A3B) dependent launches; each waits for the previous to
finish, drain and flush before its first block starts. With PDL the next kernel is launched while
this one runs: every kernel first waits for the previous one (griddepcontrol.wait), then lets the
next launch (griddepcontrol.launch_dependents), so at most two kernels are resident and the next
one's launch and block start-up overlap this one's work. CuPy's RawKernel call cannot set launch
attributes, so this launches through the driver's cuLaunchKernelEx with
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; inside a stream capture the attribute becomes
a programmatic edge of the graph.

Whether PDL is on is the backend's choice (BackendConfig.pdl, resolved once by `resolve`), passed
to each wrapper as `pdl=`; a module compiled with it defines LT_PDL (`source_head`).
"""
import ctypes
import functools

import numpy as np

from lite.kernels.cuda_source import source

# CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h, CUlaunchAttributeID)
ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6

# The prologue every decode kernel starts with (kernels/cuda/pdl.cuh).
C_PDL = source("pdl.cuh")


def resolve(setting=None):
    """PDL on or off: True / False as set, None (auto): on where the current GPU has griddepcontrol
    (compute capability 9.0+) and the driver has cuLaunchKernelEx."""
    return bool(setting) if setting is not None else _current_device_has_pdl()


def _current_device_has_pdl():
    try:
        import cupy
        device = cupy.cuda.runtime.getDevice()
    except Exception:             # no CuPy or no GPU (the CPU tests, the host emulation)
        return False
    return _has_pdl(device) and _driver_ok()


@functools.lru_cache(maxsize=None)
def _driver_ok():
    """Can ctypes reach the driver's cuLaunchKernelEx (CUDA 12.0+; libcuda.so.1)? If not, plain
    launches, so that auto never turns a working setup into a failing one."""
    try:
        _driver()
        return True
    except (OSError, AttributeError):
        return False


@functools.lru_cache(maxsize=None)
def _has_pdl(device):
    import cupy
    try:
        return int(cupy.cuda.Device(device).compute_capability) >= 90
    except Exception:
        return False


def source_head(pdl=False):
    """What a module's source starts with: LT_PDL defined when pdl (then a separate module)."""
    return "#define LT_PDL\n" if pdl else ""


def call(func, grid, block, args, stream=None, shared_mem=0, pdl=False):
    """func(grid, block, args) on stream (a CuPy stream; None: the current one), through launch()
    with programmatic dependencies when pdl."""
    if not pdl:
        return func(grid, block, args, shared_mem=shared_mem, stream=stream)
    if stream is None:
        import cupy
        stream = cupy.cuda.get_current_stream()
    launch(func, grid, block, args, stream.ptr, shared_mem)


class LaunchAttribute(ctypes.Structure):       # CUlaunchAttribute: id, pad to 8, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint64 * 8)]


class LaunchConfig(ctypes.Structure):          # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_SCALARS = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
            np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.uint64): ctypes.c_uint64,
            np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


def pack(args):
    """Kernel arguments as ctypes values (device arrays and None as 64-bit pointers, NumPy scalars
    as their C types) and the void* array cuLaunchKernelEx takes; keep both alive until launched."""
    vals = []
    for a in args:
        if a is None:
            vals.append(ctypes.c_uint64(0))
        elif hasattr(a, "data") and hasattr(a.data, "ptr"):        # a CuPy array
            vals.append(ctypes.c_uint64(a.data.ptr))
        elif isinstance(a, np.ndarray):           # host memory (the emulator tests' stand-in arrays)
            vals.append(ctypes.c_uint64(a.ctypes.data))
        elif isinstance(a, np.generic) and a.dtype in _SCALARS:
            vals.append(_SCALARS[a.dtype](a.item()))
        else:
            raise TypeError(f"pdl.pack: cannot pass {type(a).__name__} to a kernel")
    ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    return vals, ptrs


@functools.lru_cache(maxsize=None)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    f = lib.cuLaunchKernelEx
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                  ctypes.c_void_p]
    return f


def function_handle(func):
    """The CUfunction of func: RawModule.get_function gives a RawKernel, whose `kernel` is the
    cupy.cuda.Function (loaded on the current device) that holds the handle as `ptr`."""
    k = getattr(func, "kernel", None)
    return int((k if k is not None else func).ptr)


def launch(func, grid, block, args, stream_ptr, shared_mem=0):
    """func (a CuPy RawModule function) on the stream whose handle is stream_ptr, with programmatic
    stream serialization; grid and block tuples of up to 3, shared_mem dynamic shared bytes."""
    grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
    attr = LaunchAttribute(id=ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1                          # programmaticStreamSerializationAllowed (an int)
    cfg = LaunchConfig(*grid, *block, shared_mem, ctypes.c_void_p(stream_ptr), ctypes.pointer(attr), 1)
    vals, ptrs = pack(args)
    err = _driver()(ctypes.byref(cfg), ctypes.c_void_p(function_handle(func)), ptrs, None)
    if err != 0:
        raise RuntimeError(f"cuLaunchKernelEx (programmatic dependent launch) failed: CUresult {err}")
    del vals
