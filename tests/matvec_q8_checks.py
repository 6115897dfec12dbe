"""What the emulated tests of the int8 decode products share (test_matvec_q8_emulated.py: the K types;
test_matvec_q8_iq3_emulated.py: IQ3_XXS; test_matvec_mma_emulated.py): the host shims and the kernels'
signature, the test x and its quantization, the product check within the x quantization's bound, and
IQ3_XXS's integer-dot module text."""
import numpy as np

from cuda_c_emulator import HOST_SHIMS
from kernel_blocks import reference

from lite.kernels import matvec_cuda, matvec_q8

Q8_SHIMS = r"""
inline int __float2int_rn(float v) { return (int)std::nearbyint(v); }   // default mode: to nearest even
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
"""
ARGS = "const unsigned char* w, const float* x, float* out, int rows, int cols"


def _x(n, cols, rng):
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::7] *= 100.0                        # a wide range inside a run
    x[:, 64 + 16:64 + 32] = 0.0               # a run of zeros (d = 0)
    x[:, 5] = 1e-30                           # tiny beside its run
    return x


def _quantize(lib, qt, x):
    n, cols = x.shape
    xq = np.zeros_like(x)
    lib.launch(f"emu_qx_{qt}", matvec_q8.quantize_grid(n, cols), (128,), x, xq, np.int32(cols))
    return xq


def _xoff(qt, c, k):
    """The column of float4 k of chunk c (the xoff of matvec_structs' TQ4_K / TQ6_K, matvec_iq's
    Iq3XxsBlock)."""
    p = c & 7
    if qt == "IQ3_XXS":
        return 32 * c + 4 * k
    if qt == "Q4_K":
        return (c >> 3) * 256 + 64 * (p >> 1) + 16 * (p & 1) + 32 * (k >> 2) + 4 * (k & 3)
    return (c >> 3) * 256 + 128 * (p >> 2) + 8 * (p & 3) + 32 * (k >> 1) + 4 * (k & 1)


def quant_bound(qt, x, w):
    """|W| @ e, e_i = max |x| of i's run / 64,516: how far W times quantized x may be from W x (the
    contract of matvec_q8's docstring), beside the fp32 tolerance every kernel gets."""
    n, cols = x.shape
    c = np.arange(cols // 32)
    runs = np.stack([_xoff(qt, c, k)[:, None] + np.arange(4) for k in range(8)], 1).reshape(-1, 2, 16)
    e = np.zeros((n, cols))
    for run in (0, 1):
        idx = runs[:, run]                                             # (chunks, 16)
        e[:, idx] = (np.abs(x[:, idx]).max(axis=2, keepdims=True) / 64516.0)
    return e @ np.abs(w).T


def assert_product_matches(lib, name, grid, stored, blocks, qt, x, rows, cols, threads=128, raw_x=False, xq=None):
    """Launch kernel `name` over `stored` (blocks, or their regrouped bytes) and qt's quantized x (x
    itself if raw_x: the kernel quantizes it; xq if given: x quantized by the caller); its product within
    1e-3 of float64 (gguf-py's dequantize of `blocks`) plus the fp32 tolerance and the x quantization's
    bound."""
    w = reference(blocks, qt).astype(np.float64).reshape(rows, cols)
    ref, scale = x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ np.abs(w).T
    out = np.full((x.shape[0], rows), np.nan, np.float32)
    xin = xq if xq is not None else x if raw_x else _quantize(lib, qt, x)
    lib.launch(name, grid, (threads,), stored, xin, out, np.int32(rows), np.int32(cols))
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= 1e-3 * np.abs(ref) + 1e-5 * scale + quant_bound(qt, x, w)), np.max(err / (np.abs(ref) + 1e-30))


def _gpu():
    from conftest import HAS_GPU
    from lite.kernels.util import SIMULATOR
    return HAS_GPU and not SIMULATOR


# matvec_fused_end's arguments (kernels/matvec_epilogue.py).
EPI_ARGS = ("const unsigned char* w, const float* x, float* out, int rows, int cols, const float* res, "
            "const float* g, float* xg, float* part, float* scale, int* counter, float eps")


def _iq3_source():
    """IQ3_XXS's integer-dot module text for the emulator (matvec_q8.c_source without the asm helpers)."""
    from lite.kernels import dequant_iq, iq_tables, matvec_iq
    return ("#define GCOPIES 0\n" + HOST_SHIMS + Q8_SHIMS
            + "inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }\n"
            + dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS") + iq_tables.c_offset_tables()
            + matvec_cuda.C_HEAD + matvec_cuda.C_KERNEL + matvec_iq.C_PERSISTENT + matvec_iq.C_COMMON
            + matvec_iq.C_IQ3_XXS + matvec_iq.C_IQ3_XXS_STAGED + matvec_q8.C_MATVEC_WITH_INIT + matvec_q8.structs("IQ3_XXS"))
