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


define("Q2_K", _dec_q2_k, r"""
__device__ __forceinline__ void dec_q2_k(const uchar* b, int j, float* v) {
    const float d = hf(b, 80), dmin = hf(b, 82);
    const int sc = b[j >> 4];
    const float dl = MUL(d, (float)(sc & 15)), ml = MUL(dmin, (float)(sc >> 4));
    const uint2 q = ld8_a2(b + 16 + 32 * (j >> 7) + (j & 31));
    const int sh = ((j & 127) >> 5) * 2;
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = SUB(MUL(dl, (float)((byte_of(q, i) >> sh) & 3)), ml);
}""")

define("Q3_K", _dec_q3_k, r"""
__device__ __forceinline__ void dec_q3_k(const uchar* b, int j, float* v) {
    const float d = hf(b, 108);
    const int k = j >> 4;
    const int lo = (b[96 + (k & 7)] >> (4 * (k >> 3))) & 15, hi = (b[104 + (k & 3)] >> (2 * (k >> 2))) & 3;
    const float dl = MUL(d, (float)((lo | (hi << 4)) - 32));
    // Blocks are 110 bytes: fields are only 2-byte aligned in shared memory.
    const uint2 q = ld8_a2(b + 32 + 32 * (j >> 7) + (j & 31)), hm = ld8_a2(b + (j & 31));
    const int sh = ((j & 127) >> 5) * 2, hb = j >> 5;
    #pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] = MUL(dl, (float)((int)((byte_of(q, i) >> sh) & 3) - (int)((((byte_of(hm, i) >> hb) & 1) ^ 1) << 2)));
}""")

C_SCALE_MIN_K4 = r"""
__device__ __forceinline__ void scale_min_k4(const uchar* s, int k, int* sc, int* m) {
    if (k < 4) { *sc = s[k] & 63; *m = s[k + 4] & 63; }
    else { *sc = (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4); *m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4); }
}"""

define("Q4_K", _dec_q4_k, C_SCALE_MIN_K4 + r"""
__device__ __forceinline__ void dec_q4_k(const uchar* b, int j, float* v) {
    int sc, m; scale_min_k4(b + 4, j >> 5, &sc, &m);
    const float dd = MUL(hf(b, 0), (float)sc), dm = MUL(hf(b, 2), (float)m);
    // 16 + 32*c + l with l a multiple of 8 and the block 16-aligned in shared memory: 8-byte aligned.
    const uint2 w = *(const uint2*)(b + 16 + 32 * (j >> 6) + (j & 31));
    const int sh = ((j >> 5) & 1) * 4;
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = SUB(MUL(dd, (float)((byte_of(w, i) >> sh) & 15)), dm);
}""")

define("Q5_K", _dec_q5_k, C_SCALE_MIN_K4 + r"""
__device__ __forceinline__ void dec_q5_k(const uchar* b, int j, float* v) {
    int sc, m; scale_min_k4(b + 4, j >> 5, &sc, &m);
    const float dd = MUL(hf(b, 0), (float)sc), dm = MUL(hf(b, 2), (float)m);
    // 176-byte blocks stay 16-aligned in shared memory, so both fields are 8-byte aligned.
    const uint2 q = *(const uint2*)(b + 48 + 32 * (j >> 6) + (j & 31)), qh = *(const uint2*)(b + 16 + (j & 31));
    const int sh = ((j >> 5) & 1) * 4, hb = j >> 5;
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = SUB(MUL(dd, (float)(((byte_of(q, i) >> sh) & 15) | (((byte_of(qh, i) >> hb) & 1) << 4))), dm);
}""")

define("Q6_K", _dec_q6_k, r"""
__device__ __forceinline__ void dec_q6_k(const uchar* b, int j, float* v) {
    const float dd = MUL(hf(b, 208), (float)(signed char)b[192 + (j >> 4)]);
    const int h = j >> 7, r = j & 127;
    // 210-byte blocks: fields are only 2-byte aligned in shared memory.
    const uint2 ql = ld8_a2(b + 64 * h + (r & 63)), qh = ld8_a2(b + 128 + 32 * h + (r & 31));
    const int lsh = (r >> 6) * 4, hsh = (r >> 5) * 2;
    #pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] = MUL(dd, (float)((int)(((byte_of(ql, i) >> lsh) & 15) | (((byte_of(qh, i) >> hsh) & 3) << 4)) - 32));
}""")
