"""Programmatic dependent launch (PDL, sm_90+) for the decode kernels (LITE_PDL=1, opt-in: written
without a GPU, session 4): the matvecs of kernels/matvec_epilogue.py and the decode attention
(RoPE + KV store, attention v1 and v2).

A decode step is ~230 dependent launches (8B shape); each waits for the previous to finish, drain
and flush before its first block starts, and the tail of one kernel leaves SMs idle while the next
is being launched. With PDL the next kernel is launched while this one runs: its blocks start as SMs
free up, prefetch their weights into L2 (which no kernel writes), and wait (griddepcontrol.wait) for
the previous kernel's results before reading x. Kernels opt in with LT_PDL (C_PDL's helpers, or
PDL_PROLOGUE at the top of kernels with nothing to prefetch);
CuPy's RawKernel call cannot set launch attributes, so this launches through the driver's
cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION. Inside a stream
capture the attribute becomes a programmatic edge of the graph.
"""
import ctypes
import functools
import os

import numpy as np

# CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h, CUlaunchAttributeID)
ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6

# The CUDA C a kernel puts at its start under LT_PDL: let the next kernel launch, prefetch what
# does not depend on the previous kernel (the caller's loop), then wait for the previous kernel.
C_PDL = r"""
#ifndef LT_PDL_HELPERS
#define LT_PDL_HELPERS
#ifdef LT_PDL
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_prefetch_l2(const unsigned char* p, long long nbytes) {
    for (long long i = (long long)threadIdx.x * 128; i < nbytes; i += (long long)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" :: "l"(p + i));
}
// A kernel with nothing to prefetch: let the next launch, wait for the previous (every thread).
#define PDL_PROLOGUE() do { pdl_launch_dependents(); pdl_wait(); } while (0)
// A matvec: the same, with its R weight rows of rb bytes (rowp) prefetched into L2 in between.
template <int R>
__device__ __forceinline__ void pdl_rows_prologue(const unsigned char* const (&rowp)[R], long long rb) {
    pdl_launch_dependents();
    #pragma unroll
    for (int r = 0; r < R; r++) pdl_prefetch_l2(rowp[r], rb);
    pdl_wait();
}
#define PDL_ROWS_PROLOGUE(rowp, rb) pdl_rows_prologue(rowp, rb)
#else
#define PDL_PROLOGUE() do { } while (0)
#define PDL_ROWS_PROLOGUE(rowp, rb) do { } while (0)
#endif
#endif
"""


def enabled():
    """LITE_PDL=1: decode launches with programmatic dependencies (read at each launch)."""
    return os.environ.get("LITE_PDL", "0") == "1"


def source_head():
    """What a module's source starts with: LT_PDL defined when enabled() (then a separate module)."""
    return "#define LT_PDL\n" if enabled() else ""


def call(func, grid, block, args, stream=None, shared_mem=0):
    """func(grid, block, args) on stream (a CuPy stream; None: the current one), through launch()
    with programmatic dependencies when enabled()."""
    if not enabled():
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
