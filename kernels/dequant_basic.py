"""Dequantize kernels for the float and legacy types (F16, BF16, F32, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
MXFP4). The tiled scheme, the launcher and the registration live in dequant_common.py."""
from lite.kernels.dequant_common import (  # noqa: F401  (KERNELS: the registry tests use)
    EPT, KERNELS, _dev, add, b8, define, h2f, mul, mxfp4_value, np, s8, u16, u2f)



# ---------------------------------------------------------------- float types (one value a "block")
@_dev
def _dec_f16(sm, base, j, v):
    for i in range(EPT):
        v[i] = h2f(u16(sm, base + 2 * i))


@_dev
def _dec_bf16(sm, base, j, v):
    for i in range(EPT):
        v[i] = u2f(u16(sm, base + 2 * i) << 16)


@_dev
def _dec_f32(sm, base, j, v):
    for i in range(EPT):
        v[i] = u2f(sm[(base >> 2) + i])


define("F16", _dec_f16)
define("BF16", _dec_bf16)
define("F32", _dec_f32)


# ---------------------------------------------------------------- legacy 32-value blocks
# Values 0..15 are the low nibbles of qs[0..15], values 16..31 the high nibbles; a run of 8
# never straddles the two halves.
@_dev
def _dec_q4_0(sm, base, j, v):
    d = h2f(u16(sm, base))
    sh = (j >> 4) * 4
    for i in range(EPT):
        q = ((b8(sm, base + 2 + ((j + i) & 15)) >> sh) & 15) - 8
        v[i] = mul(d, np.float32(q))


@_dev
def _dec_q4_1(sm, base, j, v):
    d = h2f(u16(sm, base))
    m = h2f(u16(sm, base + 2))
    sh = (j >> 4) * 4
    for i in range(EPT):
        q = (b8(sm, base + 4 + ((j + i) & 15)) >> sh) & 15
        v[i] = add(mul(d, np.float32(q)), m)


@_dev
def _dec_q5_0(sm, base, j, v):
    d = h2f(u16(sm, base))
    qh = u16(sm, base + 2) | (u16(sm, base + 4) << 16)
    sh = (j >> 4) * 4
    for i in range(EPT):
        q = (((b8(sm, base + 6 + ((j + i) & 15)) >> sh) & 15) | (((qh >> (j + i)) & 1) << 4)) - 16
        v[i] = mul(d, np.float32(q))


@_dev
def _dec_q5_1(sm, base, j, v):
    d = h2f(u16(sm, base))
    m = h2f(u16(sm, base + 2))
    qh = u16(sm, base + 4) | (u16(sm, base + 6) << 16)
    sh = (j >> 4) * 4
    for i in range(EPT):
        q = ((b8(sm, base + 8 + ((j + i) & 15)) >> sh) & 15) | (((qh >> (j + i)) & 1) << 4)
        v[i] = add(mul(d, np.float32(q)), m)


@_dev
def _dec_q8_0(sm, base, j, v):
    d = h2f(u16(sm, base))
    for i in range(EPT):
        v[i] = mul(np.float32(s8(b8(sm, base + 2 + j + i))), d)


@_dev
def _dec_mxfp4(sm, base, j, v):
    e = b8(sm, base)
    # e8m0 to float, halved (ggml_e8m0_to_fp32_half): the values table is doubled.
    d = u2f((0x00200000 << e) if e < 2 else ((e - 1) << 23))
    sh = (j >> 4) * 4
    for i in range(EPT):
        v[i] = mul(d, mxfp4_value((b8(sm, base + 1 + ((j + i) & 15)) >> sh) & 15))


define("Q4_0", _dec_q4_0)
define("Q4_1", _dec_q4_1)
define("Q5_0", _dec_q5_0)
define("Q5_1", _dec_q5_1)
define("Q8_0", _dec_q8_0)
define("MXFP4", _dec_mxfp4)
