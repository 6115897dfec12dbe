"""Dequantize kernels for the K quant types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): 256 values a block.

Same tiled scheme as dequant_common.py (read its docstring): a Numba decoder for the simulator and
as the GPU reference, and a CUDA C decoder for the GPU hot path, both in the reference's
operation order. A run of 8 values (j a multiple of 8) always lies within one 16-value scale
group, so each run needs one scale (and one min).
"""
import numpy as np

from lite.kernels.dequant_common import EPT, _dev, b8, define, h2f, mul, s8, sub, u16


# Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
# Value j: half h = j//128, shift pair s = (j%128)//32, lane l = j%32 -> (qs[32h + l] >> 2s) & 3.
@_dev
def _dec_q2_k(sm, base, j, v):
    d = h2f(u16(sm, base + 80))
    dmin = h2f(u16(sm, base + 82))
    sc = b8(sm, base + (j >> 4))
    dl = mul(d, np.float32(sc & 15))
    ml = mul(dmin, np.float32(sc >> 4))
    q0 = base + 16 + 32 * (j >> 7) + (j & 31)
    sh = ((j & 127) >> 5) * 2
    for i in range(EPT):
        v[i] = sub(mul(dl, np.float32((b8(sm, q0 + i) >> sh) & 3)), ml)


# Q3_K: hmask[32], qs[64], scales[12] (16 six-bit signed scales), d.
@_dev
def _dec_q3_k(sm, base, j, v):
    d = h2f(u16(sm, base + 108))
    k = j >> 4
    lo = (b8(sm, base + 96 + (k & 7)) >> (4 * (k >> 3))) & 15
    hi = (b8(sm, base + 104 + (k & 3)) >> (2 * (k >> 2))) & 3
    dl = mul(d, np.float32((lo | (hi << 4)) - 32))
    q0 = base + 32 + 32 * (j >> 7) + (j & 31)
    sh = ((j & 127) >> 5) * 2
    hbit = j >> 5
    for i in range(EPT):
        ql = (b8(sm, q0 + i) >> sh) & 3
        h = (b8(sm, base + (j & 31) + i) >> hbit) & 1
        # A set high bit means no offset; a clear one subtracts 4.
        v[i] = mul(dl, np.float32(ql - ((h ^ 1) << 2)))


@_dev
def _scale_min_k4(sm, base, k):
    """(scale, min) of sub-block k (0..7) from the 12 packed 6-bit bytes at base+4."""
    s = base + 4
    if k < 4:
        return b8(sm, s + k) & 63, b8(sm, s + k + 4) & 63
    return ((b8(sm, s + k + 4) & 15) | ((b8(sm, s + k - 4) >> 6) << 4),
            (b8(sm, s + k + 4) >> 4) | ((b8(sm, s + k) >> 6) << 4))


# Q4_K: d, dmin, scales[12], qs[128]. Value j: chunk c = j//64, nibble (j//32)%2, lane j%32.
@_dev
def _dec_q4_k(sm, base, j, v):
    sc, m = _scale_min_k4(sm, base, j >> 5)
    dd = mul(h2f(u16(sm, base)), np.float32(sc))
    dm = mul(h2f(u16(sm, base + 2)), np.float32(m))
    q0 = base + 16 + 32 * (j >> 6) + (j & 31)
    sh = ((j >> 5) & 1) * 4
    for i in range(EPT):
        v[i] = sub(mul(dd, np.float32((b8(sm, q0 + i) >> sh) & 15)), dm)


# Q5_K: d, dmin, scales[12], qh[32], qs[128]; the fifth bit of value j is bit j//32 of qh[j%32].
@_dev
def _dec_q5_k(sm, base, j, v):
    sc, m = _scale_min_k4(sm, base, j >> 5)
    dd = mul(h2f(u16(sm, base)), np.float32(sc))
    dm = mul(h2f(u16(sm, base + 2)), np.float32(m))
    q0 = base + 48 + 32 * (j >> 6) + (j & 31)
    sh = ((j >> 5) & 1) * 4
    hbit = j >> 5
    for i in range(EPT):
        q = ((b8(sm, q0 + i) >> sh) & 15) | (((b8(sm, base + 16 + (j & 31) + i) >> hbit) & 1) << 4)
        v[i] = sub(mul(dd, np.float32(q)), dm)


# Q6_K: ql[128], qh[64], scales[16] (int8), d. Value j: half h = j//128, r = j%128;
# low 4 bits from ql[64h + r%64] (nibble r//64), high 2 bits from qh[32h + r%32] (pair r//32).
@_dev
def _dec_q6_k(sm, base, j, v):
    dd = mul(h2f(u16(sm, base + 208)), np.float32(s8(b8(sm, base + 192 + (j >> 4)))))
    h = j >> 7
    r = j & 127
    l0 = base + 64 * h + (r & 63)
    h0 = base + 128 + 32 * h + (r & 31)
    lsh = (r >> 6) * 4
    hsh = (r >> 5) * 2
    for i in range(EPT):
        q = ((b8(sm, l0 + i) >> lsh) & 15) | (((b8(sm, h0 + i) >> hsh) & 3) << 4)
        v[i] = mul(dd, np.float32(q - 32))


define("Q2_K", _dec_q2_k)

define("Q3_K", _dec_q3_k)

define("Q4_K", _dec_q4_k)

define("Q5_K", _dec_q5_k)

define("Q6_K", _dec_q6_k)
