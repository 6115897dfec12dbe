"""Warp reductions as Numba device functions: shuffles on the GPU, shared memory under the simulator.

  warp_sum(v)          -> float32 sum of v over the 32 lanes of the calling warp, returned to every lane
  group_sum(v, width)  -> the same over aligned groups of `width` lanes (width a power of two, 1..32),
                          e.g. width=16 sums each half-warp separately

Contract (so that both paths behave the same): every thread of the block calls it, from uniform
control flow, with the block's threads laid out so that a warp is 32 consecutive linear thread ids.
The shuffle path only needs the whole warp; the simulator path is a block-wide barrier because the
simulator has no warp shuffles (numba-cuda 0.30), so a kernel that calls it from a branch taken by
part of a block would deadlock there and be wrong on the GPU anyway.

The implementation is chosen at import time from kernels.util.SIMULATOR.
"""
from numba import cuda, float32

from lite.kernels.util import SIMULATOR

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


__all__ = ["warp_sum", "group_sum", "FULL_MASK"]
