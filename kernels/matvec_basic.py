"""Fused dequantize-and-dot (decode matvec) for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K,
in Numba.

On a GPU the launcher hands aligned inputs to the CUDA C kernels of kernels/matvec_cuda.py (2-4x
faster: these Numba kernels are bound by instructions); reference=True keeps them here. The
Numba kernels are the twin CI runs under the simulator, checked against the CUDA C ones on the GPU.

out (n, rows) f32 = x (n, cols) f32 @ W.T, W (rows, cols) as GGUF blocks, fp32 accumulation.

Shape of the work (why it is laid out this way, see shared device notes: too few bytes in flight a
thread was what held earlier GEMVs at 8-24% of bandwidth):
  - A CTA owns ROWS rows and WARPS warps. Each warp walks its share of every row's columns, so a row
    is split across the CTA's warps and the grid has enough warps even for 4096-row matrices.
  - A lane's step is one *unit*: one 32-bit word of quants (two for Q8_0) = 8 values, in two runs of
    4 consecutive columns. The lane loads the 8 x values once (per x row) and reuses them for all
    ROWS rows, which cuts L1 traffic for x by ROWS and gives each lane ROWS independent weight loads
    in flight. Lanes of one warp cover consecutive words, so weight loads are fully coalesced.
  - Each type's unit decoder (kernels/matvec_units.py) returns 8 small integers q and per-run
    factors (a, b) with contribution = a * sum(q * x) + b * sum(x); sum(x) is shared by all rows
    (Q4_K/Q5_K minimums).
  - Partial sums stay in registers; warp sums and one cross-warp sum in shared memory at the end.
Blocks are read as uint32 words (wide loads); types whose block size is not a multiple of 4 bytes
(Q4_0 18, Q8_0 34, Q6_K 210) read their fields with a funnel shift across two words.
"""
import logging
import math

import numpy as np
from numba import cuda, float32

from lite.kernels import matvec_cuda
from lite.kernels.matvec_units import SPECS
from lite.kernels.registry import array_module, quant_info, register_matvec
from lite.kernels.util import SIMULATOR, numba_stream, warp_sum

log = logging.getLogger(__name__)

WARPS = 4          # warps per CTA
ROWS = 4           # rows per CTA
UNROLL = 2         # units decoded per loop trip
MAX_N = 8          # x rows per launch; more are done in chunks of MAX_N


# ---------------------------------------------------------------- the generic kernel
def make_kernel(qtype, n, rows_per_cta=ROWS, warps=WARPS, unroll=UNROLL):
    """A Numba kernel for `qtype` and exactly `n` x rows: kernel(w_u32, w_f16, x, out, rows, cols).

    w_u32 and w_f16 view the same block bytes. Launch with grid ceil(rows / rows_per_cta) and
    block 32 * warps. `unroll` units are decoded per loop trip so that their loads are in flight
    together (the tail is clamped to a valid unit and its x zeroed, to stay branch-free).
    """
    info = quant_info(qtype)
    unit, cols_of, upb = SPECS[info.name]
    be, ts = info.block_elems, info.type_size
    R, NW, U = rows_per_cta, warps, unroll
    NA, NX, NS = n * R, 8 * n, 2 * n      # local array sizes must be compile-time constants
    THREADS = 32 * NW

    @cuda.jit
    def kernel(w, wh, x, out, rows, cols):
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        row0 = cuda.blockIdx.x * R
        nb = cols // be
        row_bytes = nb * ts
        units = nb * upb
        acc = cuda.local.array(NA, float32)
        for i in range(NA):
            acc[i] = float32(0.0)
        xv = cuda.local.array(NX, float32)
        sx = cuda.local.array(NS, float32)
        q = cuda.local.array(8, float32)
        ab = cuda.local.array(4, float32)
        u0 = tid
        while u0 < units:
            for uu in range(U):
                u = min(u0 + uu * THREADS, units - 1)
                valid = float32(u0 + uu * THREADS < units)
                blk = u // upb
                part = u - blk * upb
                c0, c1 = cols_of(part)
                c0 += blk * be
                c1 += blk * be
                for s in range(n):
                    s0 = float32(0.0)
                    s1 = float32(0.0)
                    for k in range(4):
                        v0 = x[s, c0 + k] * valid
                        v1 = x[s, c1 + k] * valid
                        xv[8 * s + k] = v0
                        xv[8 * s + 4 + k] = v1
                        s0 += v0
                        s1 += v1
                    sx[2 * s] = s0
                    sx[2 * s + 1] = s1
                for r in range(R):
                    # Rows past the end compute on the last row (uniform control flow for the
                    # warp sums below) and are not written.
                    row = min(row0 + r, rows - 1)
                    unit(w, wh, row * row_bytes + blk * ts, part, q, ab)
                    for s in range(n):
                        d0 = float32(0.0)
                        d1 = float32(0.0)
                        for k in range(4):
                            d0 = cuda.fma(q[k], xv[8 * s + k], d0)
                            d1 = cuda.fma(q[4 + k], xv[8 * s + 4 + k], d1)
                        acc[s * R + r] += (ab[0] * d0 + ab[1] * sx[2 * s]) + (ab[2] * d1 + ab[3] * sx[2 * s + 1])
            u0 += THREADS * U
        part_sums = cuda.shared.array((NW, NA), float32)
        for i in range(NA):
            v = warp_sum(acc[i])
            if lane == 0:
                part_sums[warp, i] = v
        cuda.syncthreads()
        if tid < NA:
            s = tid // R
            r = tid - s * R
            if row0 + r < rows:
                tot = float32(0.0)
                for i in range(NW):
                    tot += part_sums[i, tid]
                out[s, row0 + r] = tot

    return kernel


_KERNELS = {}


def _kernel(name, n):
    key = (name, n)
    if key not in _KERNELS:
        _KERNELS[key] = make_kernel(name, n)
    return _KERNELS[key]


def as_words(blocks_u8):
    """The blocks as a uint32 view (copied into an aligned, padded buffer only where they are not
    4-byte aligned or not a whole number of words, e.g. an odd number of Q4_0 blocks)."""
    xp = array_module(blocks_u8)
    ptr = blocks_u8.data.ptr if xp is not np else blocks_u8.ctypes.data
    if ptr % 4 or blocks_u8.size % 4:
        log.debug("matvec: copying %d unaligned block bytes into a padded buffer", blocks_u8.size)
        padded = xp.zeros((blocks_u8.size + 7) // 4 * 4, dtype=np.uint8)
        padded[:blocks_u8.size] = blocks_u8
        blocks_u8 = padded
    return blocks_u8.view(np.uint32)


def _launch(name):
    info = quant_info(name)

    def launch(blocks_u8, x, out, rows, cols, stream=None, pdl=False,
               int8_dot_types=matvec_cuda.INT8_DOT_TYPES, reference=False):
        if blocks_u8.dtype != np.uint8 or blocks_u8.ndim != 1:
            raise ValueError(f"blocks must be a 1-D uint8 array, got {blocks_u8.dtype} {blocks_u8.shape}")
        if cols % info.block_elems or blocks_u8.size != rows * (cols // info.block_elems) * info.type_size:
            raise ValueError(f"{blocks_u8.size} bytes do not hold a {rows}x{cols} {name} matrix")
        if x.ndim != 2 or x.shape[1] != cols or x.dtype != np.float32 or not x.flags.c_contiguous:
            raise ValueError(f"x must be a C-contiguous (n, {cols}) float32 array, got {x.shape} {x.dtype}")
        n = x.shape[0]
        if out.shape != (n, rows) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous ({n}, {rows}) float32 array, got {out.shape} {out.dtype}")
        if n == 0 or rows == 0:
            return
        if (not SIMULATOR and not reference and array_module(blocks_u8) is not np
                and matvec_cuda.qualifies(name, blocks_u8, x)):
            return matvec_cuda.launch(name, blocks_u8, x, out, rows, cols, stream, pdl=pdl, int8_dot_types=int8_dot_types)
        w = as_words(blocks_u8)
        wh = w.view(np.float16)
        ns = numba_stream(stream)
        grid = math.ceil(rows / ROWS)
        for s0 in range(0, n, MAX_N):
            s1 = min(n, s0 + MAX_N)
            _kernel(name, s1 - s0)[grid, 32 * WARPS, ns](w, wh, x[s0:s1], out[s0:s1], rows, cols)

    launch.__name__ = f"matvec_{name.lower()}"
    return launch


for _name in SPECS:
    register_matvec(_name)(_launch(_name))
