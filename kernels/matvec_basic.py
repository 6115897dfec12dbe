"""Fused dequantize-and-dot (decode matvec) for Q4_0, Q8_0, Q4_K, Q5_K and Q6_K, in Numba.

out (n, rows) f32 = x (n, cols) f32 @ W.T, W (rows, cols) as GGUF blocks, fp32 accumulation.

Shape of the work (why it is laid out this way, see shared device notes: too few bytes in flight a
thread was what held earlier GEMVs at 8-24% of bandwidth):
  - A CTA owns ROWS rows and WARPS warps. Each warp walks its share of every row's columns, so a row
    is split across the CTA's warps and the grid has enough warps even for 4096-row matrices.
  - A lane's step is one *unit*: one 32-bit word of quants (two for Q8_0) = 8 values, in two runs of
    4 consecutive columns. The lane loads the 8 x values once (per x row) and reuses them for all
    ROWS rows, which cuts L1 traffic for x by ROWS and gives each lane ROWS independent weight loads
    in flight. Lanes of one warp cover consecutive words, so weight loads are fully coalesced.
  - Each type's unit decoder returns 8 small integers q and per-run factors (a, b) with
    contribution = a * sum(q * x) + b * sum(x); sum(x) is shared by all rows (Q4_K/Q5_K minimums).
  - Partial sums stay in registers; warp sums and one cross-warp sum in shared memory at the end.
Blocks are read as uint32 words (wide loads); types whose block size is not a multiple of 4 bytes
(Q4_0 18, Q8_0 34, Q6_K 210) read their fields with a funnel shift across two words.
"""
import logging
import math

import numpy as np
from numba import cuda, float32, int32

from lite.kernels.reduce import warp_sum
from lite.kernels.registry import array_module, quant_info, register_matvec
from lite.kernels.util import numba_stream

log = logging.getLogger(__name__)

WARPS = 4          # warps per CTA
ROWS = 4           # rows per CTA
MAX_N = 8          # x rows per launch; more are done in chunks of MAX_N


# ---------------------------------------------------------------- byte/word helpers
@cuda.jit(device=True)
def f16_to_f32(h):
    # Exact for normal, subnormal and zero halves (inf/NaN do not occur in valid blocks).
    e = (h >> 10) & 31
    m = (h & 1023) | (int32(e != 0) << 10)
    e = max(e, 1)
    v = float32(m) * float32(1 << e) * float32(2.0 ** -25)
    return -v if h & 0x8000 else v


@cuda.jit(device=True)
def ld32u(w, off):
    """32 bits at an even byte offset that may not be 4-aligned."""
    i = off >> 2
    v = w[i]
    if off & 3:
        v = ((v >> 16) | (w[i + 1] << 16)) & 0xFFFFFFFF
    return v


@cuda.jit(device=True)
def ld16(w, off):
    return (w[off >> 2] >> ((off & 3) * 8)) & 0xFFFF


@cuda.jit(device=True)
def ld8s(w, off):
    b = int32((w[off >> 2] >> ((off & 3) * 8)) & 0xFF)
    return b - ((b & 0x80) << 1)


@cuda.jit(device=True)
def _scale_byte(i, s0, s1, s2):
    v = s0 if i < 4 else (s1 if i < 8 else s2)
    return (v >> ((i & 3) * 8)) & 0xFF


@cuda.jit(device=True)
def scale_min_k4(j, s0, s1, s2):
    """6-bit (scale, min) of sub-block j of a Q4_K/Q5_K block from its 12 scale bytes (3 words)."""
    if j < 4:
        return _scale_byte(j, s0, s1, s2) & 63, _scale_byte(j + 4, s0, s1, s2) & 63
    hi = _scale_byte(j + 4, s0, s1, s2)
    sc = (hi & 0xF) | ((_scale_byte(j - 4, s0, s1, s2) >> 6) << 4)
    mn = (hi >> 4) | ((_scale_byte(j, s0, s1, s2) >> 6) << 4)
    return sc, mn


# ---------------------------------------------------------------- unit decoders
# unit(w, base, part, q, ab): block at byte `base`, unit `part` of it -> q[0:8], ab[0:4]
# cols(part) -> (first column of run 0, first column of run 1) inside the block

@cuda.jit(device=True)
def _k4_header(w, i0, part, ab):
    hd = w[i0]
    s0 = w[i0 + 1]
    s1 = w[i0 + 2]
    s2 = w[i0 + 3]
    d = f16_to_f32(hd & 0xFFFF)
    dmin = f16_to_f32(hd >> 16)
    j = part >> 3
    sc, mn = scale_min_k4(2 * j, s0, s1, s2)
    ab[0] = d * float32(sc)
    ab[1] = -dmin * float32(mn)
    sc, mn = scale_min_k4(2 * j + 1, s0, s1, s2)
    ab[2] = d * float32(sc)
    ab[3] = -dmin * float32(mn)


@cuda.jit(device=True)
def q4k_unit(w, base, part, q, ab):
    # 144-byte blocks: base is 4-aligned. Word `part` of qs holds values 64j+4m+k (low nibbles)
    # and 64j+32+4m+k (high nibbles), j = part // 8, m = part % 8.
    i0 = base >> 2
    qw = w[i0 + 4 + part]
    _k4_header(w, i0, part, ab)
    for k in range(4):
        q[k] = float32((qw >> (8 * k)) & 0xF)
        q[4 + k] = float32((qw >> (8 * k + 4)) & 0xF)


@cuda.jit(device=True)
def q5k_unit(w, base, part, q, ab):
    # 176-byte blocks: d, dmin, scales[12], qh[32], qs[128]; the 5th bit of value 64j+l is bit 2j
    # of qh[l] (bit 2j+1 for value 64j+32+l).
    i0 = base >> 2
    hw = w[i0 + 4 + (part & 7)]
    qw = w[i0 + 12 + part]
    _k4_header(w, i0, part, ab)
    sh = 2 * (part >> 3)
    for k in range(4):
        q[k] = float32(((qw >> (8 * k)) & 0xF) | (((hw >> (8 * k + sh)) & 1) << 4))
        q[4 + k] = float32(((qw >> (8 * k + 4)) & 0xF) | (((hw >> (8 * k + sh + 1)) & 1) << 4))


@cuda.jit(device=True)
def k_cols(part):
    c = 64 * (part >> 3) + 4 * (part & 7)
    return c, c + 32


@cuda.jit(device=True)
def q6k_unit(w, base, part, q, ab):
    # 210-byte blocks: ql[128], qh[64], scales[16] (int8), d. Half h = part // 16 covers 128
    # values; ql word m holds values 4m+k (low nibbles) and 64+4m+k (high), whose top two bits
    # sit in qh[32h + (4m+k) % 32] at bit 2*(m // 8) (+4 for the high run).
    h = part >> 4
    m = part & 15
    ql = ld32u(w, base + 64 * h + 4 * m)
    qh = ld32u(w, base + 128 + 32 * h + 4 * (m & 7))
    d = f16_to_f32(ld16(w, base + 208))
    sc0 = ld8s(w, base + 192 + 8 * h + (m >> 2))
    sc1 = ld8s(w, base + 196 + 8 * h + (m >> 2))
    sh = 2 * (m >> 3)
    for k in range(4):
        q[k] = float32(int32(((ql >> (8 * k)) & 0xF) | (((qh >> (8 * k + sh)) & 3) << 4)) - 32)
        q[4 + k] = float32(int32(((ql >> (8 * k + 4)) & 0xF) | (((qh >> (8 * k + sh + 4)) & 3) << 4)) - 32)
    ab[0] = d * float32(sc0)
    ab[1] = float32(0.0)
    ab[2] = d * float32(sc1)
    ab[3] = float32(0.0)


@cuda.jit(device=True)
def q6k_cols(part):
    c = 128 * (part >> 4) + 4 * (part & 15)
    return c, c + 64


@cuda.jit(device=True)
def q4_0_unit(w, base, part, q, ab):
    # 18-byte blocks: d, qs[16]; value j = (qs[j] & 15) - 8, value 16+j = (qs[j] >> 4) - 8.
    d = f16_to_f32(ld16(w, base))
    qw = ld32u(w, base + 2 + 4 * part)
    for k in range(4):
        q[k] = float32(int32((qw >> (8 * k)) & 0xF) - 8)
        q[4 + k] = float32(int32((qw >> (8 * k + 4)) & 0xF) - 8)
    ab[0] = d
    ab[1] = float32(0.0)
    ab[2] = d
    ab[3] = float32(0.0)


@cuda.jit(device=True)
def q4_0_cols(part):
    return 4 * part, 16 + 4 * part


@cuda.jit(device=True)
def q8_0_unit(w, base, part, q, ab):
    # 34-byte blocks: d, qs[32] int8.
    d = f16_to_f32(ld16(w, base))
    w0 = ld32u(w, base + 2 + 8 * part)
    w1 = ld32u(w, base + 6 + 8 * part)
    for k in range(4):
        b = int32((w0 >> (8 * k)) & 0xFF)
        q[k] = float32(b - ((b & 0x80) << 1))
        b = int32((w1 >> (8 * k)) & 0xFF)
        q[4 + k] = float32(b - ((b & 0x80) << 1))
    ab[0] = d
    ab[1] = float32(0.0)
    ab[2] = d
    ab[3] = float32(0.0)


@cuda.jit(device=True)
def q8_0_cols(part):
    return 8 * part, 8 * part + 4


# name: (unit decoder, column map, units per block, whether sum(x) is needed)
_SPECS = {
    "Q4_K": (q4k_unit, k_cols, 32, True),
    "Q5_K": (q5k_unit, k_cols, 32, True),
    "Q6_K": (q6k_unit, q6k_cols, 32, False),
    "Q4_0": (q4_0_unit, q4_0_cols, 4, False),
    "Q8_0": (q8_0_unit, q8_0_cols, 4, False),
}


# ---------------------------------------------------------------- the generic kernel
def make_kernel(qtype, n, rows_per_cta=ROWS, warps=WARPS):
    """A Numba kernel for `qtype` and exactly `n` x rows: kernel(w_u32, x, out, rows, cols).

    Launch with grid ceil(rows / rows_per_cta) and block 32 * warps.
    """
    info = quant_info(qtype)
    unit, cols_of, upb, need_sx = _SPECS[info.name]
    be, ts = info.block_elems, info.type_size
    R, NW = rows_per_cta, warps
    NA = n * R
    THREADS = 32 * NW

    @cuda.jit
    def kernel(w, x, out, rows, cols):
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
        xv = cuda.local.array(8 * n, float32)
        sx = cuda.local.array(2 * n, float32)
        q = cuda.local.array(8, float32)
        ab = cuda.local.array(4, float32)
        u = tid
        while u < units:
            blk = u // upb
            part = u - blk * upb
            c0, c1 = cols_of(part)
            c0 += blk * be
            c1 += blk * be
            for s in range(n):
                s0 = float32(0.0)
                s1 = float32(0.0)
                for k in range(4):
                    v0 = x[s, c0 + k]
                    v1 = x[s, c1 + k]
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
                unit(w, row * row_bytes + blk * ts, part, q, ab)
                for s in range(n):
                    d0 = float32(0.0)
                    d1 = float32(0.0)
                    for k in range(4):
                        d0 = cuda.fma(q[k], xv[8 * s + k], d0)
                        d1 = cuda.fma(q[4 + k], xv[8 * s + 4 + k], d1)
                    t = ab[0] * d0 + ab[2] * d1
                    if need_sx:
                        t += ab[1] * sx[2 * s] + ab[3] * sx[2 * s + 1]
                    acc[s * R + r] += t
            u += THREADS
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

    def launch(blocks_u8, x, out, rows, cols, stream=None):
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
        w = as_words(blocks_u8)
        ns = numba_stream(stream)
        grid = math.ceil(rows / ROWS)
        for s0 in range(0, n, MAX_N):
            s1 = min(n, s0 + MAX_N)
            _kernel(name, s1 - s0)[grid, 32 * WARPS, ns](w, x[s0:s1], out[s0:s1], rows, cols)

    launch.__name__ = f"matvec_{name.lower()}"
    return launch


for _name in _SPECS:
    register_matvec(_name)(_launch(_name))
