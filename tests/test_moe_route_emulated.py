"""The router and the combine of kernels/cuda/moe_layer.cu on the host through
tests/cuda_c_emulator.py: moe_logits then moe_topk give what route_ref says, and moe_combine with
res writes exactly res + (its output without res)."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from test_kernels_matvec_emulated import HOST_SHIMS

from lite.kernels import moe_layer as mk
from lite.kernels.moe_layer import C_MOE

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

SHIMS = ("inline unsigned short moe_f2h(float f) { return f2h(f); }\n"
         "inline float __fmul_rn(float a, float b) { return a * b; }\n"
         "inline float __fadd_rn(float a, float b) { return a + b; }\n"
         # moe_align's (compiled with the rest of C_MOE, never launched here)
         "inline unsigned __match_any_sync(unsigned, int) { return 0; }\n")
WRAP = r"""
extern "C" __global__ void topk4(const float* l, int* ids, float* wts, int T, int n, int k, int nz) {
    moe_topk<4>(l, ids, wts, T, n, k, nz); }
"""


@pytest.fixture(scope="module")
def lib():
    return emu.compile_kernels(HOST_SHIMS + SHIMS + C_MOE + WRAP)


@pytest.mark.parametrize("T,n_expert,k,normalize", [(1, 128, 8, 1), (3, 100, 4, 0)])
def test_logits_then_topk_give_route_ref(lib, T, n_expert, k, normalize):
    rng = np.random.default_rng(T)
    n_embd = 96
    h = rng.standard_normal((T, n_embd)).astype(np.float32)
    w = rng.standard_normal((n_expert, n_embd)).astype(np.float32)
    i32 = np.int32
    lg = np.full((T, n_expert), np.nan, np.float32)
    lib.launch("moe_logits", (-(-T * n_expert // 4),), (128,), h, w, lg, i32(T), i32(n_embd), i32(n_expert))
    ids, wts = np.full((T, k), -1, np.int32), np.full((T, k), np.nan, np.float32)
    lib.launch("topk4", (-(-T // 4),), (128,), lg, ids, wts, i32(T), i32(n_expert), i32(k), i32(normalize))
    rid, rw = mk.route_ref(h.astype(np.float64) @ w.T.astype(np.float64), k, bool(normalize))
    np.testing.assert_array_equal(ids, rid)
    np.testing.assert_allclose(wts, rw, rtol=1e-5)


def test_combine_with_the_residual_is_the_add_after_it(lib):
    """moe_combine with res (the default for a decode token: the residual add after the MoE block)
    writes exactly res + (its output without res), in the same fp32."""
    rng = np.random.default_rng(11)
    T, k, n_embd = 2, 8, 300
    y = rng.standard_normal((T * k, n_embd)).astype(np.float32)
    w = rng.random((T, k)).astype(np.float32)
    res = (rng.standard_normal((T, n_embd)) * 10).astype(np.float32)
    pos = rng.permutation(T * k).astype(np.int32)
    plain, folded = (np.full((T, n_embd), np.nan, np.float32) for _ in range(2))
    # a thread a column (grid: column blocks, tokens)
    for out, r in ((plain, None), (folded, res)):
        lib.launch("moe_combine", (2, T), (256,), y, pos, w, out, np.int32(k), np.int32(n_embd), r)
    np.testing.assert_allclose(plain, mk.combine_ref(y, pos, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(folded, res + plain)
