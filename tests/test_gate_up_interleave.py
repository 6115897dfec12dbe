"""[gate; up] stored with rows alternating (lite/backends/cuda.py _interleave,
kernels/matvec_epilogue.interleave_rows): a product over the stored rows, as prefill's GEMM runs
it, splits back into the gate and up products in CUDALinear.linear_many. (The gated decode kernel
over that layout: tests/test_matvec_epilogue.py; both end to end on the GPU: test_cuda_backend.)"""
import types

import numpy as np
import pytest

from lite.backends.cuda_linear import CUDALinear
from lite.kernels.matvec_epilogue import interleave_rows


@pytest.mark.parametrize("F", [1, 6, 13])
def test_linear_many_splits_interleaved_rows(F):
    rng = np.random.default_rng(F)
    gate, up = rng.standard_normal((F, 8)), rng.standard_normal((F, 8))
    stored = np.concatenate([gate, up])[interleave_rows(F)]
    assert sorted(interleave_rows(F)) == list(range(2 * F))
    be = CUDALinear()
    be.w = {}
    names = ("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight")
    be.fused = {names: (types.SimpleNamespace(data=stored), [F, F], True)}
    be._product = lambda x, w: x @ w.data.T
    x = rng.standard_normal((3, 8))
    g, u = be.linear_many(x, list(names))
    np.testing.assert_allclose(g, x @ gate.T)
    np.testing.assert_allclose(u, x @ up.T)
