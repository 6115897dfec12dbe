"""Fused dequantize-and-dot (decode matvec) for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K,
in Numba.

On a GPU the launcher hands aligned inputs to the CUDA C kernels of kernels/matvec_cuda.py (2-4x
faster: these Numba kernels are bound by instructions); LITE_MATVEC_IMPL=numba keeps them here. The
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
  - Each type's unit decoder returns 8 small integers q and per-run factors (a, b) with
    contribution = a * sum(q * x) + b * sum(x); sum(x) is shared by all rows (Q4_K/Q5_K minimums).
  - Partial sums stay in registers; warp sums and one cross-warp sum in shared memory at the end.
Blocks are read as uint32 words (wide loads); types whose block size is not a multiple of 4 bytes
(Q4_0 18, Q8_0 34, Q6_K 210) read their fields with a funnel shift across two words.
"""
import logging
import math

import numpy as np
from numba import cuda, float32, int32, uint64

from lite.kernels import matvec_cuda
from lite.kernels.matvec_iq import impl
from lite.kernels.reduce import warp_sum
from lite.kernels.registry import array_module, quant_info, register_matvec
from lite.kernels.util import SIMULATOR, numba_stream

log = logging.getLogger(__name__)

WARPS = 4          # warps per CTA
ROWS = 4           # rows per CTA
UNROLL = 2         # units decoded per loop trip
MAX_N = 8          # x rows per launch; more are done in chunks of MAX_N


# ---------------------------------------------------------------- byte/word helpers
if SIMULATOR:
    @cuda.jit(device=True)
    def bits_to_f32(i):
        return np.array([i], dtype=np.uint32).view(np.float32)[0]
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def bits_to_f32(i):
        return libdevice.int_as_float(int32(i))

# Quant values are turned into floats without int->float conversions (quarter rate on the GPU):
# a b-bit value q placed in the top mantissa bits of 1.0f reads as f = 1 + q / 2^b, so
# sum(q x) = 2^b * (sum(f x) - sum(x)); each decoder folds that into its (a, b) factors.
ONE = 0x3F800000


@cuda.jit(device=True)
def ld32u(w, off):
    """32 bits at an even byte offset that may not be 4-aligned (branch-free funnel shift)."""
    i = off >> 2
    lo = uint64(w[i])
    hi = uint64(w[min(i + 1, w.shape[0] - 1)])
    return ((hi << uint64(32)) | lo) >> uint64((off & 2) * 8) & uint64(0xFFFFFFFF)


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
    """6-bit (scale, min) of sub-block j of a Q4_K/Q5_K block from its 12 scale bytes (3 words).
    Both encodings are computed and one selected: j differs between lanes of a warp."""
    bj = _scale_byte(j, s0, s1, s2)
    bj4 = _scale_byte(j + 4, s0, s1, s2)
    bjm4 = _scale_byte(max(j - 4, 0), s0, s1, s2)
    lo = j < 4
    sc = (bj & 63) if lo else ((bj4 & 0xF) | ((bjm4 >> 6) << 4))
    mn = (bj4 & 63) if lo else ((bj4 >> 4) | ((bj >> 6) << 4))
    return sc, mn


# ---------------------------------------------------------------- unit decoders
# unit(w, wh, base, part, q, ab): the block at byte `base` (w: uint32 view, wh: float16 view of the
# same bytes), unit `part` of it -> q[0:8] floats and ab[0:4] with
#   contribution = ab[0] * sum(q[0:4] x[run 0]) + ab[1] * sum(x[run 0]) + (ab[2], ab[3]) for run 1
# cols(part) -> (first column of run 0, first column of run 1) inside the block

@cuda.jit(device=True)
def _k_header(w, wh, i0, part, ab, bits):
    d = float32(wh[2 * i0])
    dmin = float32(wh[2 * i0 + 1])
    s0 = w[i0 + 1]
    s1 = w[i0 + 2]
    s2 = w[i0 + 3]
    j = part >> 3
    f = float32(1 << bits)
    sc, mn = scale_min_k4(2 * j, s0, s1, s2)
    a = f * d * float32(sc)
    ab[0] = a
    ab[1] = -a - dmin * float32(mn)
    sc, mn = scale_min_k4(2 * j + 1, s0, s1, s2)
    a = f * d * float32(sc)
    ab[2] = a
    ab[3] = -a - dmin * float32(mn)


@cuda.jit(device=True)
def q4k_unit(w, wh, base, part, q, ab):
    # 144-byte blocks: base is 4-aligned. Word `part` of qs holds values 64j+4m+k (low nibbles)
    # and 64j+32+4m+k (high nibbles), j = part // 8, m = part % 8.
    i0 = base >> 2
    qw = w[i0 + 4 + part]
    _k_header(w, wh, i0, part, ab, 4)
    for k in range(4):
        q[k] = bits_to_f32(ONE | (((qw >> (8 * k)) & 0xF) << 19))
        q[4 + k] = bits_to_f32(ONE | (((qw >> (8 * k + 4)) & 0xF) << 19))


@cuda.jit(device=True)
def q5k_unit(w, wh, base, part, q, ab):
    # 176-byte blocks: d, dmin, scales[12], qh[32], qs[128]; the 5th bit of value 64j+l is bit 2j
    # of qh[l] (bit 2j+1 for value 64j+32+l).
    i0 = base >> 2
    hw = w[i0 + 4 + (part & 7)]
    qw = w[i0 + 12 + part]
    _k_header(w, wh, i0, part, ab, 5)
    sh = 2 * (part >> 3)
    for k in range(4):
        lo = ((qw >> (8 * k)) & 0xF) | (((hw >> (8 * k + sh)) & 1) << 4)
        hi = ((qw >> (8 * k + 4)) & 0xF) | (((hw >> (8 * k + sh + 1)) & 1) << 4)
        q[k] = bits_to_f32(ONE | (lo << 18))
        q[4 + k] = bits_to_f32(ONE | (hi << 18))


@cuda.jit(device=True)
def k_cols(part):
    c = 64 * (part >> 3) + 4 * (part & 7)
    return c, c + 32


@cuda.jit(device=True)
def q6k_unit(w, wh, base, part, q, ab):
    # 210-byte blocks: ql[128], qh[64], scales[16] (int8), d. Half h = part // 16 covers 128
    # values; ql word m holds values 4m+k (low nibbles) and 64+4m+k (high), whose top two bits
    # sit in qh[32h + (4m+k) % 32] at bit 2*(m // 8) (+4 for the high run). Value = q - 32.
    h = part >> 4
    m = part & 15
    ql = ld32u(w, base + 64 * h + 4 * m)
    qh = ld32u(w, base + 128 + 32 * h + 4 * (m & 7))
    d = float32(wh[(base + 208) >> 1])
    sc0 = ld8s(w, base + 192 + 8 * h + (m >> 2))
    sc1 = ld8s(w, base + 196 + 8 * h + (m >> 2))
    sh = 2 * (m >> 3)
    for k in range(4):
        lo = ((ql >> (8 * k)) & 0xF) | (((qh >> (8 * k + sh)) & 3) << 4)
        hi = ((ql >> (8 * k + 4)) & 0xF) | (((qh >> (8 * k + sh + 4)) & 3) << 4)
        q[k] = bits_to_f32(ONE | (lo << 17))
        q[4 + k] = bits_to_f32(ONE | (hi << 17))
    a = float32(64.0) * d * float32(sc0)
    ab[0] = a
    ab[1] = float32(-1.5) * a
    a = float32(64.0) * d * float32(sc1)
    ab[2] = a
    ab[3] = float32(-1.5) * a


@cuda.jit(device=True)
def q6k_cols(part):
    c = 128 * (part >> 4) + 4 * (part & 15)
    return c, c + 64


@cuda.jit(device=True)
def q4_0_unit(w, wh, base, part, q, ab):
    # 18-byte blocks: d, qs[16]; value j = (qs[j] & 15) - 8, value 16+j = (qs[j] >> 4) - 8.
    d = float32(wh[base >> 1])
    qw = ld32u(w, base + 2 + 4 * part)
    for k in range(4):
        q[k] = bits_to_f32(ONE | (((qw >> (8 * k)) & 0xF) << 19))
        q[4 + k] = bits_to_f32(ONE | (((qw >> (8 * k + 4)) & 0xF) << 19))
    a = float32(16.0) * d
    ab[0] = a
    ab[1] = float32(-1.5) * a
    ab[2] = a
    ab[3] = float32(-1.5) * a


@cuda.jit(device=True)
def q4_0_cols(part):
    return 4 * part, 16 + 4 * part


@cuda.jit(device=True)
def q8_0_unit(w, wh, base, part, q, ab):
    # 34-byte blocks: d, qs[32] int8. Flipping the sign bit maps int8 v to v + 128 in 0..255.
    d = float32(wh[base >> 1])
    w0 = ld32u(w, base + 2 + 8 * part) ^ 0x80808080
    w1 = ld32u(w, base + 6 + 8 * part) ^ 0x80808080
    for k in range(4):
        q[k] = bits_to_f32(ONE | (((w0 >> (8 * k)) & 0xFF) << 15))
        q[4 + k] = bits_to_f32(ONE | (((w1 >> (8 * k)) & 0xFF) << 15))
    a = float32(256.0) * d
    ab[0] = a
    ab[1] = float32(-1.5) * a
    ab[2] = a
    ab[3] = float32(-1.5) * a


@cuda.jit(device=True)
def q8_0_cols(part):
    return 8 * part, 8 * part + 4


@cuda.jit(device=True)
def q4_1_unit(w, wh, base, part, q, ab):
    # 20-byte blocks: d, m, qs[16]; value j = d * (qs[j] & 15) + m, value 16+j from the high nibble.
    d = float32(wh[base >> 1])
    m = float32(wh[(base >> 1) + 1])
    qw = ld32u(w, base + 4 + 4 * part)
    for k in range(4):
        q[k] = bits_to_f32(ONE | (((qw >> (8 * k)) & 0xF) << 19))
        q[4 + k] = bits_to_f32(ONE | (((qw >> (8 * k + 4)) & 0xF) << 19))
    a = float32(16.0) * d
    ab[0] = a
    ab[1] = m - a
    ab[2] = a
    ab[3] = m - a


@cuda.jit(device=True)
def _q5_unit(w, base, qh_off, qs_off, part, q):
    # 5-bit values: the low 4 bits from qs's nibbles, bit 4 of value j from bit j of qh (32 bits).
    qh = ld32u(w, base + qh_off)
    qw = ld32u(w, base + qs_off + 4 * part)
    for k in range(4):
        j = 4 * part + k
        lo = ((qw >> (8 * k)) & 0xF) | (((qh >> j) & 1) << 4)
        hi = ((qw >> (8 * k + 4)) & 0xF) | (((qh >> (j + 16)) & 1) << 4)
        q[k] = bits_to_f32(ONE | (lo << 18))
        q[4 + k] = bits_to_f32(ONE | (hi << 18))


@cuda.jit(device=True)
def q5_0_unit(w, wh, base, part, q, ab):
    # 22-byte blocks: d, qh, qs[16]; value = d * (q5 - 16).
    d = float32(wh[base >> 1])
    _q5_unit(w, base, 2, 6, part, q)
    a = float32(32.0) * d
    ab[0] = a
    ab[1] = float32(-1.5) * a
    ab[2] = a
    ab[3] = float32(-1.5) * a


@cuda.jit(device=True)
def q5_1_unit(w, wh, base, part, q, ab):
    # 24-byte blocks: d, m, qh, qs[16]; value = d * q5 + m.
    d = float32(wh[base >> 1])
    m = float32(wh[(base >> 1) + 1])
    _q5_unit(w, base, 4, 8, part, q)
    a = float32(32.0) * d
    ab[0] = a
    ab[1] = m - a
    ab[2] = a
    ab[3] = m - a


# name: (unit decoder, column map, units per block)
_SPECS = {
    "Q4_K": (q4k_unit, k_cols, 32),
    "Q5_K": (q5k_unit, k_cols, 32),
    "Q6_K": (q6k_unit, q6k_cols, 32),
    "Q4_0": (q4_0_unit, q4_0_cols, 4),
    "Q8_0": (q8_0_unit, q8_0_cols, 4),
    # Q4_1/Q5_0/Q5_1 (SmolLM2's and Gemma 3's files): Numba only on the GPU too, so that a decode
    # step of those models has a fused product for every matrix and can be captured in a graph.
    "Q4_1": (q4_1_unit, q4_0_cols, 4),
    "Q5_0": (q5_0_unit, q4_0_cols, 4),
    "Q5_1": (q5_1_unit, q4_0_cols, 4),
}


# ---------------------------------------------------------------- the generic kernel
def make_kernel(qtype, n, rows_per_cta=ROWS, warps=WARPS, unroll=UNROLL):
    """A Numba kernel for `qtype` and exactly `n` x rows: kernel(w_u32, w_f16, x, out, rows, cols).

    w_u32 and w_f16 view the same block bytes. Launch with grid ceil(rows / rows_per_cta) and
    block 32 * warps. `unroll` units are decoded per loop trip so that their loads are in flight
    together (the tail is clamped to a valid unit and its x zeroed, to stay branch-free).
    """
    info = quant_info(qtype)
    unit, cols_of, upb = _SPECS[info.name]
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
        if (not SIMULATOR and impl() == "cuda" and array_module(blocks_u8) is not np
                and matvec_cuda.qualifies(name, blocks_u8, x)):
            return matvec_cuda.launch(name, blocks_u8, x, out, rows, cols, stream)
        w = as_words(blocks_u8)
        wh = w.view(np.float16)
        ns = numba_stream(stream)
        grid = math.ceil(rows / ROWS)
        for s0 in range(0, n, MAX_N):
            s1 = min(n, s0 + MAX_N)
            _kernel(name, s1 - s0)[grid, 32 * WARPS, ns](w, wh, x[s0:s1], out[s0:s1], rows, cols)

    launch.__name__ = f"matvec_{name.lower()}"
    return launch


for _name in _SPECS:
    register_matvec(_name)(_launch(_name))
