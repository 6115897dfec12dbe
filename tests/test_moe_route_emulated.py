"""The router of kernels/moe_cuda_src.py on the host through tests/cuda_c_emulator.py: moe_route
(logits and top-k in one launch, the last block to finish doing the top-k: LITE_MOE_FOLD=1) gives
exactly what moe_logits then moe_topk give (the same device functions), and what route_ref says."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from test_kernels_matvec_emulated import HOST_SHIMS

from lite.kernels import moe_cuda as mk
from lite.kernels.moe_cuda_src import C_MOE

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

SHIMS = ("inline unsigned short moe_f2h(float f) { return f2h(f); }\n"
         "inline float __fmul_rn(float a, float b) { return a * b; }\n"
         "inline float __fadd_rn(float a, float b) { return a + b; }\n"
         # moe_align's (compiled with the rest of C_MOE, never launched here)
         "inline unsigned __match_any_sync(unsigned, int) { return 0; }\n")
WRAP = r"""
extern "C" __global__ void topk4(const float* l, int* ids, float* wts, int T, int n, int k, int nz) {
    moe_topk<4>(l, ids, wts, T, n, k, nz); }
extern "C" __global__ void route4(const float* h, const float* w, float* l, int* ids, float* wts, int T,
                                  int e, int n, int k, int nz, int* counter) {
    moe_route<4>(h, w, l, ids, wts, T, e, n, k, nz, counter); }
"""


@pytest.fixture(scope="module")
def lib():
    return emu.compile_kernels(HOST_SHIMS + SHIMS + C_MOE + WRAP)


@pytest.mark.parametrize("T,n_expert,k,normalize", [(1, 128, 8, 1), (3, 100, 4, 0)])
def test_fused_route_equals_the_two_launches(lib, T, n_expert, k, normalize):
    rng = np.random.default_rng(T)
    n_embd = 96
    h = rng.standard_normal((T, n_embd)).astype(np.float32)
    w = rng.standard_normal((n_expert, n_embd)).astype(np.float32)
    grid = (-(-T * n_expert // 4),)
    i32 = np.int32
    lg = np.full((T, n_expert), np.nan, np.float32)
    lib.launch("moe_logits", grid, (128,), h, w, lg, i32(T), i32(n_embd), i32(n_expert))
    ids0, w0 = np.full((T, k), -1, np.int32), np.full((T, k), np.nan, np.float32)
    lib.launch("topk4", (-(-T // 4),), (128,), lg, ids0, w0, i32(T), i32(n_expert), i32(k), i32(normalize))
    lg1 = np.full((T, n_expert), np.nan, np.float32)
    ids1, w1 = np.full((T, k), -1, np.int32), np.full((T, k), np.nan, np.float32)
    counter = np.zeros(1, np.int32)
    lib.launch("route4", grid, (128,), h, w, lg1, ids1, w1, i32(T), i32(n_embd), i32(n_expert), i32(k),
               i32(normalize), counter)
    assert counter[0] == 0                                    # ready for the next launch
    np.testing.assert_array_equal(lg1, lg)
    np.testing.assert_array_equal(ids1, ids0)
    np.testing.assert_array_equal(w1, w0)
    rid, rw = mk.route_ref(h.astype(np.float64) @ w.T.astype(np.float64), k, bool(normalize))
    np.testing.assert_array_equal(ids1, rid)
    np.testing.assert_allclose(w1, rw, rtol=1e-5)


def test_combine_with_the_residual_is_the_add_after_it(lib):
    """moe_combine with res (LITE_MOE_FOLD=1) writes exactly res + (its output without res): the
    residual add after the MoE block, in the same fp32; with the norm, also rms_norm of that."""
    rng = np.random.default_rng(11)
    T, k, n_embd = 2, 8, 300
    y = rng.standard_normal((T * k, n_embd)).astype(np.float32)
    w = rng.random((T, k)).astype(np.float32)
    res = (rng.standard_normal((T, n_embd)) * 10).astype(np.float32)
    pos = rng.permutation(T * k).astype(np.int32)
    plain, folded, normed = (np.full((T, n_embd), np.nan, np.float32) for _ in range(3))
    nw = rng.standard_normal(n_embd).astype(np.float32)
    hn = np.full((T, n_embd), np.nan, np.float32)
    # a thread a column (grid: column blocks, tokens); with the norm, one block a token
    for out, r, norm, cols in ((plain, None, (None, None), 2), (folded, res, (None, None), 2),
                               (normed, res, (nw, hn), 1)):
        lib.launch("moe_combine", (cols, T), (256,), y, pos, w, out, np.int32(k), np.int32(n_embd), r,
                   *norm, np.float32(1e-6))
    np.testing.assert_allclose(plain, mk.combine_ref(y, pos, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(folded, res + plain)
    # the next layer's RMSNorm in the same launch (LITE_MOE_FOLD=1): out as before, and its norm
    np.testing.assert_array_equal(normed, folded)
    o = normed.astype(np.float64)
    np.testing.assert_allclose(hn, o / np.sqrt((o * o).mean(1, keepdims=True) + 1e-6) * nw, rtol=1e-5,
                               atol=1e-6)
