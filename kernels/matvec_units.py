"""The per-type unit decoders of the Numba decode matvec (kernels/matvec_basic.py's make_kernel).

A lane's step is one *unit*: one 32-bit word of quants (two for Q8_0) = 8 values, in two runs of 4
consecutive columns. Each decoder writes the 8 values as small integers (as floats, q) and per-run
factors (a, b) with contribution = a * sum(q * x) + b * sum(x); the column map gives a unit's first
column of each run. Blocks are read as uint32 words; types whose block size is not a multiple of 4
bytes (Q4_0 18, Q8_0 34, Q6_K 210) read their fields with a funnel shift across two words.
"""
import numpy as np
from numba import cuda, float32, int32, uint64

from lite.kernels.util import SIMULATOR

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
SPECS = {
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
