"""kernels/matvec_epilogue.py's `mve` (decode matvec with the residual add or the gated activation
folded in) run on the host through tests/cuda_c_emulator.py: against NumPy's float64 product with
the same add / activation, and against the plain `mv` kernel plus the separate op, which is what
the decode step ran before (same fp32 operations: the two must agree exactly). The norm-in variants
(`mvn`, LITE_FOLD_NORM=1: rms_norm(x) * g folded into the product) against NumPy's float64 norm,
product and epilogue, and against `mv` of the separately normed x (rms_norm in NumPy fp32)."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from test_kernels_matvec_emulated import HOST_SHIMS

from lite.kernels import matvec_cuda, matvec_epilogue, quant_info

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

ARGS = "const unsigned char* w, const float* x, float* out, int rows, int cols, const float* res"
ARGS_NI = ARGS + ", const float* g, float eps"
TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
COLS = {"Q4_0": 32 * 33, "Q8_0": 32 * 35, "Q4_K": 768, "Q5_K": 768, "Q6_K": 768}
UNITS = 19          # odd, and no multiple of any CTA's units: the last CTA is partial


def _cases():
    out = []
    for qt in TYPES:
        for n in (1, 3):
            r, p = matvec_epilogue.config(qt, n)
            for e in matvec_epilogue.EPILOGUES.values():
                out.append((qt, n, r, p, e))
    return out


def _name(case):
    qt, n, r, p, e = case
    return f"emu_{qt}_{n}_{r}_{p}_{e}"


def _ni_cases():
    return [(qt, n, *matvec_epilogue.config(qt, n), e) for qt in TYPES for n in (1, 3)
            for e in (0, 1, 2, 3)]


@pytest.fixture(scope="module")
def lib():
    calls = "".join(
        f'extern "C" __global__ void {_name(c)}({ARGS}) {{ '
        f'{matvec_epilogue.kernel_name(c[0], c[1], c[2], c[3], c[4])}(w, x, out, rows, cols, res); }}\n'
        f'extern "C" __global__ void plain_{_name(c)}({ARGS}) {{ '
        f'mv<TQ{c[0][1:]}, {c[1]}, {c[2]}, {c[3]}>(w, x, out, rows, cols); }}\n'
        for c in _cases())
    calls += "".join(
        f'extern "C" __global__ void ni_{_name(c)}({ARGS_NI}) {{ '
        f'{matvec_epilogue.kernel_name(*c, norm_in=True)}(w, x, out, rows, cols, res, g, eps); }}\n'
        for c in _ni_cases())
    calls += "".join(   # mv of the normed x, for the n = 1, 3 configs of each type
        f'extern "C" __global__ void plain_ni_{qt}_{n}({ARGS}) {{ '
        f'mv<TQ{qt[1:]}, {n}, {r}, {p}>(w, x, out, rows, cols); }}\n'
        for qt, n, r, p, e in _ni_cases() if e == 0)
    return emu.compile_kernels(HOST_SHIMS + matvec_epilogue.c_source() + calls)


def _silu(g):
    return g / (1.0 + np.exp(-g))


def _gelu_tanh(g):
    return 0.5 * g * (1.0 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))


@pytest.mark.parametrize("case", _cases(), ids=_name)
def test_emulated_epilogue_matches_numpy_and_the_separate_op(lib, case):
    qt, n, r, p, e = case
    rng = np.random.default_rng(n * 10 + e)
    cols = COLS[qt]
    rows = UNITS if e == 1 else 2 * UNITS
    blocks = random_blocks(qt, rows * cols // quant_info(qt).block_elems, rng)
    w = reference(blocks, qt).astype(np.float64).reshape(rows, cols)
    # products of a few units either way, where silu and gelu bend (random blocks have any scale)
    x = (rng.standard_normal((n, cols)) * 4 / np.sqrt((w * w).sum(1).max())).astype(np.float32)
    y = x.astype(np.float64) @ w.T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T
    # the separate op, as the decode step ran it: mv's product, then NumPy's fp32 add / activation
    plain = np.full((n, rows), np.nan, np.float32)
    lib.launch("plain_" + _name(case), (-(-rows // r),), (128,), blocks, x, plain, np.int32(rows),
               np.int32(cols), None)
    width, units = (rows, r) if e == 1 else (UNITS, r // 2)
    out = np.full((n, width), np.nan, np.float32)
    res = rng.standard_normal((n, rows)).astype(np.float32) if e == 1 else None
    lib.launch(_name(case), (-(-width // units),), (128,), blocks, x, out, np.int32(rows),
               np.int32(cols), res)
    if e == 1:
        ref, tol = y + res, 1e-3 * scale + 1e-6
        np.testing.assert_array_equal(out, plain + res)
    else:
        g, u = y[:, :UNITS], y[:, UNITS:]
        act = _silu if e == 2 else _gelu_tanh
        ref = act(g) * u
        # d/dg of act(g) is at most ~1.1, so an error of eps*scale in g moves act(g)*u by about that
        tol = 2e-3 * (scale[:, :UNITS] * np.abs(u) + np.abs(act(g)) * scale[:, UNITS:]) + 1e-6
        g32, u32 = plain[:, :UNITS], plain[:, UNITS:]
        sep = (g32 / (np.float32(1) + np.exp(-g32)) * u32 if e == 2 else
               np.float32(0.5) * g32 * (np.float32(1) + np.tanh(np.float32(0.7978845608028654) * (
                   g32 + np.float32(0.044715) * g32 * g32 * g32))) * u32)
        np.testing.assert_allclose(out, sep, rtol=1e-6, atol=1e-6 * float(np.abs(sep).max()))
    assert np.all(np.abs(out - ref) <= tol), np.max(np.abs(out - ref) / tol)


def _rms_norm_f32(x, g, eps):
    """cupy_ops' rms_norm kernel in NumPy fp32: x * rsqrt(mean(x^2) + eps) * g."""
    r = np.float32(1) / np.sqrt((x * x).sum(1, dtype=np.float32) / np.float32(x.shape[1])
                                + np.float32(eps))
    return x * r[:, None] * g


# Rows of 4096 (the 8B shape's hidden size): 128 chunks, so every thread of all four warps loads x
# and adds to the sum of squares (the rows of COLS leave warps 2-3 idle).
WIDE = [(qt, 1, *matvec_epilogue.config(qt, 1), e) for qt in ("Q4_K", "Q6_K", "Q8_0") for e in (0, 2)]


@pytest.mark.parametrize("case,cols", [(c, COLS[c[0]]) for c in _ni_cases()] + [(c, 4096) for c in WIDE],
                         ids=lambda v: ("ni_" + _name(v)) if isinstance(v, tuple) else str(v))
def test_emulated_norm_in_matches_numpy_and_mv_of_the_normed_x(lib, case, cols):
    qt, n, r, p, e = case
    rng = np.random.default_rng(100 + n * 10 + e)
    eps = 1e-5
    rows = 2 * UNITS if e >= 2 else UNITS
    blocks = random_blocks(qt, rows * cols // quant_info(qt).block_elems, rng)
    w = reference(blocks, qt).astype(np.float64).reshape(rows, cols)
    # the residual stream: large and uneven (rms ~ 30), so the norm matters; g around 1
    x = (rng.standard_normal((n, cols)) * 30).astype(np.float32)
    x[:, ::7] *= 10
    g = (1 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    xd = x.astype(np.float64)
    h = xd / np.sqrt((xd * xd).mean(1, keepdims=True) + eps) * g
    # products of a few units (so that silu and gelu bend): scale W's rows down for the gated ones
    k = 4 / np.sqrt((w * w).sum(1).max()) if e >= 2 else 1.0
    y = (h @ w.T) * k
    scale = (np.abs(h) @ np.abs(w).T) * k       # (g k rounds to fp32: 1e-7, inside the tolerance)
    res = rng.standard_normal((n, rows)).astype(np.float32) if e == 1 else None
    width, units = (rows, r) if e <= 1 else (UNITS, r // 2)
    out = np.full((n, width), np.nan, np.float32)
    # the norm undoes any scale of x, so the gated cases scale g: rms_norm(x) * (g k) = k h
    lib.launch("ni_" + _name(case), (-(-width // units),), (128,), blocks, x, out, np.int32(rows),
               np.int32(cols), res, g * np.float32(k), np.float32(eps))
    if e <= 1:
        ref, tol = y + (res if e == 1 else 0), 1e-3 * scale + 1e-6
    else:
        gg, u = y[:, :UNITS], y[:, UNITS:]
        act = _silu if e == 2 else _gelu_tanh
        ref = act(gg) * u
        tol = 2e-3 * (scale[:, :UNITS] * np.abs(u) + np.abs(act(gg)) * scale[:, UNITS:]) + 1e-6
    assert np.all(np.abs(out - ref) <= tol), np.max(np.abs(out - ref) / tol)
    if e == 0:      # against mv of the normed x (what LITE_FOLD_NORM=0 runs): ~1e-5 of the scale
        hn = _rms_norm_f32(x, g, eps)
        plain = np.full((n, rows), np.nan, np.float32)
        lib.launch(f"plain_ni_{qt}_{n}", (-(-rows // r),), (128,), blocks, hn, plain, np.int32(rows),
                   np.int32(cols), None)
        sc = np.abs(hn).astype(np.float64) @ np.abs(w).T
        assert np.all(np.abs(out - plain) <= 1e-5 * sc), np.max(np.abs(out - plain) / sc)
