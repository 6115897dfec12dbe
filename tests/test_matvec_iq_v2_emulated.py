"""kernels/matvec_iq_v2.py (IQ3_XXS decode matvec v2, opt-in, measured in session 3): its CUDA C on
the host through tests/cuda_c_emulator.py against float64 products of gguf-py's dequantize, on
matvec_cuda's `mv` loop (rows a CTA, prefetch) and matvec_staged's persistent `mvp`; and its
tables (offset-binary grid, sign masks) checked exhaustively in NumPy."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from test_kernels_matvec_emulated import HOST_SHIMS

from lite.kernels import dequant_iq, matvec_cuda, matvec_iq, matvec_iq_v2 as v2, matvec_staged, quant_info
from lite.kernels.iq_tables import grid_packed, ksigns

ARGS = "const unsigned char* w, const float* x, float* out, int rows, int cols"
# (wrapped kernel, n, rows a CTA, persistent)
KERNELS = [("mv_iq2<TIQ3_XXS2, 1, 8, 0>", 1, 8, False), ("mv_iq2<TIQ3_XXS2, 1, 8, 1>", 1, 8, False),
           ("mv_iq2<TIQ3_XXS2, 1, 4, 0>", 1, 4, False), ("mv_iq2<TIQ3_XXS2, 2, 4, 0>", 2, 4, False),
           ("mv_iq2<TIQ3_XXS2, 2, 4, 1>", 2, 4, False), ("mvp<TIQ3_XXS2, 1, 8>", 1, 8, True),
           ("mvp<TIQ3_XXS2, 1, 4>", 1, 4, True)]
# 37 rows (no multiple of 4 or 8); 3 blocks a row (odd: rows start 2 bytes off a word, blocks are
# 98 bytes) and 17 (136 chunks: a second loop trip with idle threads, the prefetch clamp).
SHAPES = [(37, 768), (11, 256 * 17)]


def test_offset_binary_decode_is_exact():
    """0x3F | u | 0 | 0 read as a float is 0.5 + u / 256, and u = G - 2 (G & M) gives
    0.75 + s g / 256 for every grid byte and both signs, with no borrow between bytes."""
    g = np.unique(grid_packed("IQ3_XXS").view(np.uint8)).astype(np.uint32)
    G = g + 64
    for neg in (0, 1):
        u = G - 2 * (G & (0x3F * neg))
        assert np.all((u >= 2) & (u < 128))
        f = ((np.uint32(0x3F) << 24) | (u << 16)).astype(np.uint32).view(np.float32).astype(np.float64)
        np.testing.assert_array_equal(f, 0.75 + (-1.0 if neg else 1.0) * g / 256)
    # whole words: bytes do not interact
    words = v2.grid64()
    for s7 in range(128):
        m = v2.sign_masks()[s7]
        for h in (0, 1):
            u = (words - 2 * (words & m[h])).view(np.uint8).reshape(-1, 4).astype(np.int64)
            sgn = np.array([-1 if (int(ksigns()[s7]) >> (4 * h + j)) & 1 else 1 for j in range(4)])
            np.testing.assert_array_equal(u - 64, sgn * grid_packed("IQ3_XXS").view(np.uint8).reshape(-1, 4))


def test_parse():
    assert v2.parse("") is None
    assert v2.parse("v2") == ("v2", 8, 0)
    assert v2.parse("v2,4") == ("v2", 4, 0)
    assert v2.parse("v2,8,1") == ("v2", 8, 1)
    assert v2.parse("v2p,4") == ("v2p", 4)
    assert v2.kernel_name(1, ("v2", 8, 1)) == "mv_iq2<TIQ3_XXS2, 1, 8, 1>"
    assert v2.kernel_name(2, ("v2p", 8)) == "mvp<TIQ3_XXS2, 2, 8>"
    with pytest.raises(ValueError):
        v2.parse("v3,8")


pytestmark_emu = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")


@pytest.fixture(scope="module", params=["l1", "shared"])
def lib(request):
    """The tables read through L1 (GCOPIES 0, the default) or from shared-memory copies (8)."""
    wrappers = "".join(f'extern "C" __global__ void emu_v2_{i}({ARGS}) {{ {k}(w, x, out, rows, cols); }}\n'
                       for i, (k, *_) in enumerate(KERNELS))
    source = ("#define GCOPIES 0\n" if request.param == "l1" else "#define GCOPIES 8\n") + (
              HOST_SHIMS + "inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }\n"
              + dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS") + v2.c_tables()
              + matvec_cuda.C_HEAD + matvec_cuda.C_KERNEL + matvec_staged.C_PERSISTENT
              + matvec_iq.C_COMMON + matvec_iq.C_IQ3_XXS + matvec_iq.C_IQ3_XXS_STAGED + v2.C_IQ3_XXS_V2
              + wrappers)
    return emu.compile_kernels(source)


@pytestmark_emu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("k", range(len(KERNELS)), ids=lambda i: KERNELS[i][0].replace(" ", ""))
def test_emulated_v2_matches_float64(lib, k, shape):
    call, n, rows_per_cta, persistent = KERNELS[k]
    rows, cols = shape
    rng = np.random.default_rng(1000 * k + cols)
    info = quant_info("IQ3_XXS")
    blocks = random_blocks("IQ3_XXS", rows * cols // info.block_elems, rng)   # zero/negative/subnormal d
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::7] *= 100.0
    w = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
    ref = x.astype(np.float64) @ w.T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T
    out = np.full((n, rows), np.nan, np.float32)
    grid = 3 if persistent else -(-rows // rows_per_cta)   # persistent: a CTA walks several row groups
    lib.launch(f"emu_v2_{k}", (grid,), (128,), blocks, x, out, np.int32(rows), np.int32(cols))
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= 1e-3 * np.abs(ref) + 1e-5 * scale), np.max(err / (np.abs(ref) + 1e-30))
