"""kernels/matvec_epilogue.py's `matvec_fused_end` (decode matvec with the residual add or the gated activation
folded in) run on the host through tests/cuda_c_emulator.py: against NumPy's float64 product with
the same add / activation, and against the plain `matvec_rows` kernel plus the separate op, which is what
the decode step ran before (same fp32 operations: the two must agree exactly). The RMSNorm split
across two launches (norm out: the residual-add launch also writes out * g and its CTAs' sums of
squares; scale in: the next product scales its totals from those sums) against NumPy's float64
norm, product and epilogue."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from cuda_c_emulator import HOST_SHIMS

from lite.kernels import matvec_cuda, matvec_epilogue, quant_info

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

ARGS = "const unsigned char* w, const float* x, float* out, int rows, int cols, const float* res"
ARGS_NM = ARGS + ", const float* g, float* xg, float* part, float* scale, int* counter, float eps"
CALL_NM = "(w, x, out, rows, cols, res, g, xg, part, scale, counter, eps)"
TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
COLS = {"Q4_0": 32 * 33, "Q8_0": 32 * 35, "Q4_K": 768, "Q5_K": 768, "Q6_K": 768}
UNITS = 19          # odd, and no multiple of any CTA's units: the last CTA is partial


def _cases():
    out = []
    for qt in TYPES:
        for n in (1, 3):
            r, p = matvec_epilogue.config(qt, n, q8=False)
            for e in matvec_epilogue.EPILOGUES.values():
                out.append((qt, n, r, p, e))
    return out


def _name(case):
    qt, n, r, p, e = case
    return f"emu_{qt}_{n}_{r}_{p}_{e}"


def _nm_cases():
    """(type, n, rows a CTA, prefetch, epilogue) of the scale-in consumers; the producer of each
    is the same type's norm-out launch."""
    return [(qt, n, *matvec_epilogue.config(qt, n, q8=False), e) for qt in TYPES for n in (1, 2)
            for e in (0, 2, 3)]


@pytest.fixture(scope="module")
def lib():
    calls = "".join(
        f'extern "C" __global__ void {_name(c)}({ARGS}) {{ '
        f'{matvec_epilogue.kernel_name(*c, q8=False)}(w, x, out, rows, cols, res, 0, 0, 0, 0, 0, 0.f); }}\n'
        f'extern "C" __global__ void plain_{_name(c)}({ARGS}) {{ '
        f'matvec_rows<{matvec_cuda.decode_struct(c[0])}, {c[1]}, {c[2]}, {c[3]}>(w, x, out, rows, cols); }}\n'
        for c in _cases())
    calls += "".join(
        f'extern "C" __global__ void nm{nm}_{_name(c)}({ARGS_NM}) {{ '
        f'{matvec_epilogue.kernel_name(*c, nm=nm, q8=False)}{CALL_NM}; }}\n'
        for nm, c in dict.fromkeys((k, c0[:4] + (1,) if k == 1 else c0)
                                   for c0 in _nm_cases() for k in (1, 2)))
    calls += "".join(
        f'extern "C" __global__ void il{int(il)}_{qt}_{n}({ARGS}) {{ '
        f'{matvec_epilogue.kernel_name(qt, n, *matvec_epilogue.config(qt, n, q8=False), 2, 0, il, q8=False)}'
        f'(w, x, out, rows, cols, res, 0, 0, 0, 0, 0, 0.f); }}\n'
        for qt, n in (("Q4_K", 1), ("Q6_K", 1), ("Q8_0", 2), ("Q4_K", 3)) for il in (False, True))
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
    # the separate op, as the decode step ran it: matvec_rows's product, then NumPy's fp32 add / activation
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


H = 768        # the hidden size between the two launches: whole blocks of every type


@pytest.mark.parametrize("case", _nm_cases(), ids=lambda c: "nm_" + _name(c))
def test_emulated_norm_split_matches_numpy(lib, case):
    """x_new = x @ W0.T + res and rms_norm(x_new) * g @ W1.T (+ the gated activation) through a
    norm-out launch and a scale-in launch, against float64."""
    qt, n, r, p, e = case
    rng = np.random.default_rng(200 + n * 10 + e)
    eps, cols0 = 1e-5, COLS[qt]
    rows1 = 2 * UNITS if e >= 2 else UNITS
    info = quant_info(qt)
    b0 = random_blocks(qt, H * cols0 // info.block_elems, rng)
    b1 = random_blocks(qt, rows1 * H // info.block_elems, rng)
    w0 = reference(b0, qt).astype(np.float64).reshape(H, cols0)
    w1 = reference(b1, qt).astype(np.float64).reshape(rows1, H)
    # producer: out = x @ W0.T + res, a residual stream that is large and uneven (the norm matters)
    x = (rng.standard_normal((n, cols0)) / np.sqrt((w0 * w0).sum(1).max())).astype(np.float32)
    res = (rng.standard_normal((n, H)) * 30).astype(np.float32)
    res[:, ::7] *= 10
    g = (1 + 0.3 * rng.standard_normal(H)).astype(np.float32)
    r0, _ = matvec_epilogue.config(qt, n, q8=False)
    parts = -(-H // r0)   # norm_parts of the float kernel (q8=False)
    out0, xg = np.full((n, H), np.nan, np.float32), np.full((n, H), np.nan, np.float32)
    part, sc = np.full((n, parts), np.nan, np.float32), np.full(n, np.nan, np.float32)
    counter = np.zeros(1, np.int32)
    lib.launch(f"nm1_{_name((qt, n, r, p, 1))}", (parts,), (128,), b0, x, out0, np.int32(H),
               np.int32(cols0), res, g, xg, part, sc, counter, np.float32(eps))
    y0 = x.astype(np.float64) @ w0.T + res
    assert np.all(np.abs(out0 - y0) <= 1e-3 * (np.abs(x) @ np.abs(w0).T) + 1e-5 * np.abs(res))
    np.testing.assert_array_equal(xg, out0 * g)                       # the same fp32 product
    o = out0.astype(np.float64)
    np.testing.assert_allclose(sc, 1 / np.sqrt((o * o).mean(1) + eps), rtol=1e-5)
    assert counter[0] == 0                                            # ready for the next launch
    # consumer: the product of rms_norm(out0) * g, scaled
    h = o / np.sqrt((o * o).mean(1, keepdims=True) + eps) * g
    k = 4 / np.sqrt((w1 * w1).sum(1).max()) if e >= 2 else 1.0   # (bend silu / gelu: scale g)
    y = (h @ w1.T) * k
    scale = (np.abs(h) @ np.abs(w1).T) * k
    width, units = (rows1, r) if e == 0 else (UNITS, r // 2)
    out = np.full((n, width), np.nan, np.float32)
    lib.launch(f"nm2_{_name(case)}", (-(-width // units),), (128,), b1, xg * np.float32(k), out,
               np.int32(rows1), np.int32(H), None, None, None, None, sc, None, np.float32(0))
    if e == 0:
        ref, tol = y, 1e-3 * scale + 1e-6
    else:
        gg, u = y[:, :UNITS], y[:, UNITS:]
        act = _silu if e == 2 else _gelu_tanh
        ref = act(gg) * u
        tol = 2e-3 * (scale[:, :UNITS] * np.abs(u) + np.abs(act(gg)) * scale[:, UNITS:]) + 1e-6
    assert np.all(np.abs(out - ref) <= tol), np.max(np.abs(out - ref) / tol)


@pytest.mark.parametrize("qt,n", [("Q4_K", 1), ("Q6_K", 1), ("Q8_0", 2), ("Q4_K", 3)])
def test_emulated_interleaved_gate_up_equals_the_plain_layout(lib, qt, n):
    """The gated kernel over [gate; up] with rows in interleave_rows' order gives exactly what it
    gives over the plain layout (the same sums, from other addresses)."""
    F = 19                                  # a multiple of no CTA's units: a partial CTA
    r, p = matvec_epilogue.config(qt, n, q8=False)
    info = quant_info(qt)
    cols = COLS[qt]
    rng = np.random.default_rng(7 + n)
    blocks = random_blocks(qt, 2 * F * cols // info.block_elems, rng).reshape(2 * F, -1)
    x = rng.standard_normal((n, cols)).astype(np.float32) * 0.01
    outs = []
    for il, w in ((False, blocks), (True, blocks[matvec_epilogue.interleave_rows(F)])):
        out = np.full((n, F), np.nan, np.float32)
        lib.launch(f"il{int(il)}_{qt}_{n}", (-(-F // (r // 2)),), (128,), np.ascontiguousarray(w).reshape(-1),
                   x, out, np.int32(2 * F), np.int32(cols), None)
        outs.append(out)
    assert not np.isnan(outs[0]).any()
    np.testing.assert_array_equal(outs[1], outs[0])
