"""Small shared pieces for kernel wrappers: simulator detection, stream conversion, warp sums."""
import numpy as np


def patch_numpy_for_numba():
    """Work-arounds for library versions, applied before numba.cuda is imported."""
    # numba-cuda 0.30 calls np.row_stack, which numpy 2.5 removed (shared device notes).
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


patch_numpy_for_numba()

from numba import config as _numba_config  # noqa: E402
from numba import cuda, float32  # noqa: E402

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

# lite orders all work of a stage on that stage's stream itself. Numba's default is to synchronize
# on the producer stream named by every CuPy array it receives (__cuda_array_interface__), which
# costs host time on each launch and breaks CUDA graph capture (cudaErrorStreamCaptureIsolation
# when the array names the legacy default stream), so it is turned off.
_numba_config.CUDA_ARRAY_INTERFACE_SYNC = False
# Small launches (one token, one expert) are intended; the occupancy warning would flood the log.
_numba_config.CUDA_LOW_OCCUPANCY_WARNINGS = False


def numba_stream(stream):
    """A Numba stream for a CuPy stream (or None -> the default stream).

    Launching on `cuda.external_stream(cupy_stream.ptr)` is what lets Numba kernels be
    captured into a CUDA graph together with CuPy work on the same stream.
    """
    if stream is None or SIMULATOR:
        return 0
    return cuda.external_stream(stream.ptr)


def as_device(a):
    """Array as a Numba device array (host arrays pass through under the simulator)."""
    if SIMULATOR:
        return a
    return cuda.as_cuda_array(a)


# --- Warp reductions as Numba device functions: shuffles on the GPU, shared memory under the simulator ---
#
#   warp_sum(v)          -> float32 sum of v over the 32 lanes of the calling warp, returned to every lane
#   group_sum(v, width)  -> the same over aligned groups of `width` lanes (width a power of two, 1..32),
#                           e.g. width=16 sums each half-warp separately
#
# Contract (so that both paths behave the same): every thread of the block calls it, from uniform
# control flow, with the block's threads laid out so that a warp is 32 consecutive linear thread ids.
# The shuffle path only needs the whole warp; the simulator path is a block-wide barrier because the
# simulator has no warp shuffles (numba-cuda 0.30), so a kernel that calls it from a branch taken by
# part of a block would deadlock there and be wrong on the GPU anyway.
#
# The implementation is chosen at import time from SIMULATOR above.

FULL_MASK = 0xFFFFFFFF
_MAX_THREADS = 1024

if SIMULATOR:
    @cuda.jit(device=True)
    def _linear_tid():
        return (cuda.threadIdx.z * cuda.blockDim.y + cuda.threadIdx.y) * cuda.blockDim.x + cuda.threadIdx.x

    @cuda.jit(device=True)
    def group_sum(v, width):
        # One slot per thread of the block; the simulator identifies this allocation by its line,
        # so every call site in every kernel shares it (the barriers below keep reuse safe).
        buf = cuda.shared.array(_MAX_THREADS, float32)
        tid = _linear_tid()
        buf[tid] = v
        cuda.syncthreads()
        # Same butterfly order as the shuffle path, so results match it bit for bit on
        # power-of-two widths (lane l adds lane l^off at each step).
        base = tid - tid % width
        lane = tid - base
        s = float32(0.0)
        vals = cuda.local.array(32, float32)
        for i in range(width):
            vals[i] = buf[base + i]
        off = width // 2
        while off > 0:
            for i in range(width):
                if i < (i ^ off):
                    a = vals[i]
                    b = vals[i ^ off]
                    vals[i] = float32(a + b)
                    vals[i ^ off] = float32(b + a)
            off //= 2
        s = vals[lane]
        cuda.syncthreads()
        return s

    @cuda.jit(device=True)
    def warp_sum(v):
        return group_sum(v, 32)
else:
    @cuda.jit(device=True)
    def group_sum(v, width):
        off = width // 2
        while off > 0:
            v += cuda.shfl_xor_sync(FULL_MASK, v, off)
            off //= 2
        return v

    @cuda.jit(device=True)
    def warp_sum(v):
        v += cuda.shfl_xor_sync(FULL_MASK, v, 16)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 8)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 4)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
        return v
