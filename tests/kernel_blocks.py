"""Random *valid* GGUF blocks for kernel tests, and the gguf-py reference dequantization.

Quant fields are random bytes (every bit pattern of them is valid for the types here); the
scale fields are then overwritten with a chosen mix of normal, negative, subnormal and zero
values, so that kernels are checked on the edge cases a real file can hold.

    blocks = random_blocks("Q4_K", 6, np.random.default_rng(0))   # (6 * 144,) uint8
    ref = reference(blocks, "Q4_K")                              # (6 * 256,) float32
"""
import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

# Byte offsets of the f16 scale fields inside one block, per type.
F16_SCALE_OFFSETS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "TQ1_0": (52,), "TQ2_0": (64,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "IQ1_S": (0,), "IQ4_NL": (0,), "IQ4_XS": (0,),
}
# Types whose values are the data themselves (one element per "block").
FLOAT_TYPES = ("F32", "F16", "BF16")
# Every type this module can make blocks for (all that gguf-py can dequantize).
ALL_TYPES = tuple(FLOAT_TYPES) + tuple(F16_SCALE_OFFSETS) + ("IQ1_M", "MXFP4", "NVFP4")


def _name(qtype):
    if isinstance(qtype, str):
        return GGMLQuantizationType[qtype.upper()].name
    return GGMLQuantizationType(int(qtype)).name


def scale_values_f16(n, rng):
    """n f16 bit patterns (uint16): a shuffled mix of positive/negative normal, subnormal and +-0.

    Every category appears at least once when n >= 4; normal magnitudes stay in [2^-8, 2) so
    that products with quant values stay finite in fp16.
    """
    cats = np.resize(np.arange(4), n)
    rng.shuffle(cats)
    sign = rng.integers(0, 2, n).astype(np.uint16) << 15
    exp = rng.integers(15 - 8, 16, n).astype(np.uint16)      # biased exponent 7..15
    mant = rng.integers(0, 1024, n).astype(np.uint16)
    normal_pos = (exp << 10) | mant
    normal_neg = normal_pos | np.uint16(0x8000)
    subnormal = sign | rng.integers(1, 1024, n).astype(np.uint16)  # exponent field 0, mantissa != 0
    zero = sign                                                   # +0 or -0
    return np.choose(cats, [normal_pos, normal_neg, subnormal, zero]).astype(np.uint16)


def _float_values(name, n, rng):
    """Random finite values for F32/F16/BF16 with zeros, negatives and subnormals mixed in."""
    if name == "F16":
        bits = rng.integers(0, 1 << 16, n).astype(np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= np.uint16(0xBFFF)   # no inf/NaN: clear top exponent bit
        k = min(n, 4)
        bits[:k] = scale_values_f16(k, rng)[:k]
        return bits.view(np.uint8)
    if name == "BF16":
        # Exponent within f32 range [-20, 10] keeps values meaningful in fp16 output too.
        sign = rng.integers(0, 2, n).astype(np.uint16) << 15
        exp = rng.integers(127 - 20, 127 + 11, n).astype(np.uint16)
        mant = rng.integers(0, 128, n).astype(np.uint16)
        bits = sign | (exp << 7) | mant
        special = rng.integers(0, 8, n)
        bits[special == 0] = sign[special == 0]                                  # +-0
        bits[special == 1] = sign[special == 1] | rng.integers(1, 128, int((special == 1).sum()))  # subnormal
        return bits.astype(np.uint16).view(np.uint8)
    vals = rng.standard_normal(n).astype(np.float32)
    vals[::5] = 0.0
    vals[1::7] = np.float32(1e-40) * rng.choice([-1, 1], size=len(vals[1::7]))  # f32 subnormals
    return vals.view(np.uint8)


def random_blocks(qtype, n_blocks, rng):
    """(n_blocks * type_size,) uint8: random valid blocks of `qtype` (name, enum or id)."""
    name = _name(qtype)
    block_elems, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    if name in FLOAT_TYPES:
        return np.ascontiguousarray(_float_values(name, n_blocks, rng))
    if name not in ALL_TYPES:
        raise NotImplementedError(f"no random block maker for {name}")
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    if name in F16_SCALE_OFFSETS:
        for off in F16_SCALE_OFFSETS[name]:
            raw[:, off:off + 2] = scale_values_f16(n_blocks, rng).view(np.uint8).reshape(n_blocks, 2)
    elif name == "IQ1_M":
        # The f16 scale is split into the top nibbles of the four uint16 scale words at byte 48.
        sc = raw[:, 48:56].copy().view(np.uint16)
        d = scale_values_f16(n_blocks, rng)
        for i in range(4):
            nib = (d >> np.uint16(4 * i)) & np.uint16(0xF)
            sc[:, i] = (sc[:, i] & np.uint16(0x0FFF)) | (nib << np.uint16(12))
        raw[:, 48:56] = sc.view(np.uint8)
    elif name == "MXFP4":
        # e8m0 exponent: 0 and 1 are the subnormal-half encodings; at most 140 keeps fp16 finite.
        cats = np.resize(np.arange(3), n_blocks)
        rng.shuffle(cats)
        e = np.choose(cats, [rng.integers(0, 2, n_blocks), rng.integers(110, 140, n_blocks),
                             rng.integers(2, 141, n_blocks)])
        raw[:, 0] = e.astype(np.uint8)
    elif name == "NVFP4":
        # ue4m3 sub-block scales: random, with some 0 and 0x7F (both read as zero).
        raw[:, 0:4] &= np.uint8(0x7F)
        mask = rng.integers(0, 6, (n_blocks, 4))
        raw[:, 0:4][mask == 0] = 0
        raw[:, 0:4][mask == 1] = 0x7F
    return raw.reshape(-1)


def reference(blocks, qtype):
    """float32 (n_blocks * block_elems,) reference values from gguf-py for uint8 blocks."""
    t = GGMLQuantizationType[_name(qtype)]
    block_elems, type_size = GGML_QUANT_SIZES[t]
    raw = np.ascontiguousarray(np.asarray(blocks, dtype=np.uint8)).reshape(-1, type_size)
    return np.asarray(quants.dequantize(raw, t), dtype=np.float32).reshape(-1)


def reference_f16(blocks, qtype):
    """The reference rounded to float16: what an fp16-output kernel must equal exactly."""
    return reference(blocks, qtype).astype(np.float16)
