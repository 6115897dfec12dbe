"""kernels/matvec_q8.py (Q4_K decode matvec on dp4a over x quantized in two int8 parts, opt-in): its
CUDA C on the host through tests/cuda_c_emulator.py. The quantizer's records are decoded here and
checked against x (the parts' ranges, the reconstruction bound a / 64,516 of matvec_q8's docstring,
the exact run sums), and mv<TQ4_KQ> after qx against float64 products of gguf-py's dequantize, at
the 1e-3 the float kernels are held to."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from test_kernels_matvec_emulated import HOST_SHIMS

from lite.kernels import matvec_cuda, matvec_q8, quant_info

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

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
# (wrapper, n, rows a CTA, prefetch)
KERNELS = [("emu_q8_1_8_0", 1, 8, 0), ("emu_q8_2_8_0", 2, 8, 0), ("emu_q8_1_4_1", 1, 4, 1),
           ("emu_q8_2_4_0", 2, 4, 0)]
SHAPES = [(37, 768), (11, 256 * 17)]   # ragged row groups; 136 chunks: a second trip with idle threads


@pytest.fixture(scope="module")
def lib():
    wraps = "".join(f'extern "C" __global__ void {name}({ARGS}) {{ '
                    f'{matvec_q8.kernel_name("Q4_K", n, r, p)}(w, x, out, rows, cols); }}\n'
                    for name, n, r, p in KERNELS)
    wraps += ('extern "C" __global__ void emu_qx(const float* x, float* xq, int cols) '
              f'{{ {matvec_q8.quantize_name("Q4_K")}(x, xq, cols); }}\n')
    source = (HOST_SHIMS + Q8_SHIMS + matvec_cuda.C_HEAD + matvec_cuda.C_TYPES + matvec_cuda.C_KERNEL
              + matvec_q8.C_Q8 + wraps)
    return emu.compile_kernels(source)


def _x(n, cols, rng):
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::7] *= 100.0                        # a wide range inside a run
    x[:, 64 + 16:64 + 32] = 0.0               # a run of zeros (d = 0)
    x[:, 5] = 1e-30                           # tiny beside its run
    return x


def _quantize(lib, x):
    n, cols = x.shape
    xq = np.zeros_like(x)
    lib.launch("emu_qx", matvec_q8.quantize_grid(n, cols), (128,), x, xq, np.int32(cols))
    return xq


def _runs_of(cols):
    """Column indices of run a and run b (16 each) of every Q4_K chunk, (chunks, 2, 16)."""
    c = np.arange(cols // 32)
    base = (c >> 3) * 256 + 64 * ((c & 7) >> 1) + 16 * (c & 1)
    return np.stack([base[:, None] + np.arange(16), base[:, None] + 32 + np.arange(16)], axis=1)


def test_quantized_x_records(lib):
    rng = np.random.default_rng(3)
    n, cols = 2, 768
    x = _x(n, cols, rng)
    xq = _quantize(lib, x)
    runs = _runs_of(cols)
    rec = xq.reshape(n, -1)[:, :cols // 32 * 20].reshape(n, cols // 32, 20)
    ints = rec[:, :, :16].copy().view(np.int8).reshape(n, -1, 4, 16).astype(np.int64)   # ha hb la lb
    f = rec[:, :, 16:]
    for i in range(n):
        for run in (0, 1):
            hi, lo = ints[i, :, run], ints[i, :, 2 + run]
            d, s = f[i, :, 2 * run].astype(np.float64), f[i, :, 2 * run + 1]
            xs = x[i][runs[:, run]].astype(np.float64)
            a = np.abs(xs).max(axis=1)
            assert np.all(np.abs(hi) <= 127) and np.all(np.abs(lo) <= 127)
            np.testing.assert_allclose(d, a / (127 * 254), rtol=1e-6)
            err = np.abs(d[:, None] * (254 * hi + lo) - xs)
            assert np.all(err <= a[:, None] / 64516 * (1 + 1e-4) + 1e-37), err.max()
            np.testing.assert_allclose(s, xs.sum(axis=1), rtol=1e-5, atol=1e-6 * np.abs(xs).sum(axis=1).max())
    assert np.all(f[:, 3, 0] == 0.0)          # chunk 3's run a is the zero run: d = 0, hi = lo = 0
    assert not np.any(ints[:, 3, 0]) and not np.any(ints[:, 3, 2])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k[0])
def test_mvq_matches_float64(lib, kernel, shape):
    name, n, rows_per_cta, _ = kernel
    rows, cols = shape
    rng = np.random.default_rng(rows + n)
    blocks = random_blocks("Q4_K", rows * cols // quant_info("Q4_K").block_elems, rng)
    x = _x(n, cols, rng)
    w = reference(blocks, "Q4_K").astype(np.float64).reshape(rows, cols)
    ref, scale = x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ np.abs(w).T
    out = np.full((n, rows), np.nan, np.float32)
    lib.launch(name, (-(-rows // rows_per_cta),), (128,), blocks, _quantize(lib, x), out, np.int32(rows), np.int32(cols))
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= 1e-3 * np.abs(ref) + 1e-5 * scale), np.max(err / (np.abs(ref) + 1e-30))


def test_unknown_type_is_a_clear_error():
    with pytest.raises(ValueError, match="Q6_K"):
        matvec_q8.launch("Q6_K", None, np.zeros((1, 256), np.float32), None, None, 1, 256)


def _gpu():
    from conftest import HAS_GPU
    from lite.kernels.util import SIMULATOR
    return HAS_GPU and not SIMULATOR


@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU (the CUDA C text runs above under the emulator)")
@pytest.mark.parametrize("config", [(8, 0), (4, 0), (4, 1)])
def test_gpu_mvq_full_size_against_float64_and_mv(config):
    """4096x14336 (the issue's shape) and a ragged 37x2048, n = 1, 2, 3: within 1e-3 of float64 and
    close to the float kernel (mvf, Q4_K's default)."""
    import cupy
    for rows, cols in ((4096, 14336), (37, 2048)):
        rng = np.random.default_rng(rows)
        blocks = random_blocks("Q4_K", rows * cols // 256, rng)
        w = reference(blocks, "Q4_K").astype(np.float64).reshape(rows, cols)
        for n in (1, 2, 3):
            x = _x(n, cols, rng)
            ref, scale = x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ np.abs(w).T
            b, xd = cupy.asarray(blocks), cupy.asarray(x)
            out, xq = cupy.full((n, rows), np.nan, cupy.float32), cupy.empty_like(xd)
            matvec_q8.launch("Q4_K", b, xd, xq, out, rows, cols, config)
            flt = cupy.empty_like(out)
            matvec_cuda.launch("Q4_K", b, xd, flt, rows, cols)
            got, flt = out.get().astype(np.float64), flt.get().astype(np.float64)
            assert np.all(np.abs(got - ref) <= 1e-3 * np.abs(ref) + 1e-5 * scale)
            assert np.all(np.abs(got - flt) <= 1e-3 * np.abs(flt) + 1e-5 * scale)


# mve (kernels/matvec_epilogue.py) over quantized x: what the decode step runs with LITE_MATVEC_Q8=1.
EPI_ARGS = ("const unsigned char* w, const float* x, float* out, int rows, int cols, const float* res, "
            "const float* g, float* xg, float* part, float* scale, int* counter, float eps")
EPI_CASES = [(n, e, nm) for n in (1, 3) for e, nm in ((1, 0), (2, 0), (3, 0), (0, 2), (2, 2))]


@pytest.fixture(scope="module")
def epi_lib(monkeypatch_module):
    from lite.kernels import matvec_epilogue
    monkeypatch_module.setattr(matvec_q8, "ENABLED", True)
    wraps = "".join(f'extern "C" __global__ void epi_{n}_{e}_{nm}({EPI_ARGS}) {{ '
                    f'{matvec_epilogue.kernel_name("Q4_K", n, *matvec_epilogue.config("Q4_K", n), e, nm)}'
                    '(w, x, out, rows, cols, res, g, xg, part, scale, counter, eps); }\n'
                    for n, e, nm in EPI_CASES)
    wraps += ('extern "C" __global__ void emu_qx(const float* x, float* xq, int cols) '
              f'{{ {matvec_q8.quantize_name("Q4_K")}(x, xq, cols); }}\n')
    assert "TQ4_KQ" in wraps and matvec_epilogue.config("Q4_K", 1) == matvec_q8.CONFIG
    return emu.compile_kernels(HOST_SHIMS + Q8_SHIMS + matvec_epilogue.c_source(q8=True) + wraps)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.parametrize("case", EPI_CASES, ids=lambda c: f"n{c[0]}-e{c[1]}-nm{c[2]}")
def test_mve_over_quantized_x_matches_float64(epi_lib, case):
    n, e, nm = case
    units, cols = 19, 768
    rows = units if e <= 1 else 2 * units
    rng = np.random.default_rng(100 + 10 * e + n + nm)
    blocks = random_blocks("Q4_K", rows * cols // 256, rng)
    w = reference(blocks, "Q4_K").astype(np.float64).reshape(rows, cols)
    x = (rng.standard_normal((n, cols)) * 4 / np.sqrt((w * w).sum(1).max())).astype(np.float32)
    sc = (rng.random(n) + 0.5).astype(np.float32)          # scale in (nm = 2): totals times scale[n]
    y = (x.astype(np.float64) @ w.T) * (sc[:, None] if nm == 2 else 1.0)
    mag = (np.abs(x).astype(np.float64) @ np.abs(w).T) * (sc[:, None] if nm == 2 else 1.0)
    res = rng.standard_normal((n, rows)).astype(np.float32)
    width = rows if e <= 1 else units
    out = np.full((n, width), np.nan, np.float32)
    xq = np.zeros_like(x)
    epi_lib.launch("emu_qx", matvec_q8.quantize_grid(n, cols), (128,), x, xq, np.int32(cols))
    r = matvec_q8.CONFIG[0]
    epi_lib.launch(f"epi_{n}_{e}_{nm}", (-(-width // (r if e <= 1 else r // 2)),), (128,), blocks, xq, out,
                   np.int32(rows), np.int32(cols), res, None, None, None, sc, None, np.float32(0))
    if e <= 1:
        ref, tol = y + (res if e == 1 else 0), 1e-3 * mag + 1e-6
    else:
        g, u = y[:, :units], y[:, units:]
        act = g / (1 + np.exp(-g)) if e == 2 else 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))
        ref = act * u
        tol = 2e-3 * (mag[:, :units] * np.abs(u) + np.abs(act) * mag[:, units:]) + 1e-6
    assert np.all(np.abs(out - ref) <= tol), np.max(np.abs(out - ref) / tol)


def test_q8_switch_routes_the_decode_products(monkeypatch):
    """LITE_MATVEC_Q8 off: the float structs; on: TQ4_KQ and matvec_q8's CTA shape for Q4_K only."""
    from lite.kernels import matvec_epilogue
    monkeypatch.setattr(matvec_q8, "ENABLED", False)
    assert "TQ4_KQ" not in matvec_epilogue.kernel_name("Q4_K", 1, 8, 0, 1)
    monkeypatch.setattr(matvec_q8, "ENABLED", True)
    assert matvec_epilogue.kernel_name("Q4_K", 1, 2, 0, 1).startswith("mve<TQ4_KQ, 1, 2, 0, 1")
    assert matvec_epilogue.config("Q4_K", 1) == matvec_q8.CONFIG
    assert matvec_epilogue.config("Q6_K", 1) == matvec_cuda.CONFIG["Q6_K"]
    assert "TQ6_K," in matvec_epilogue.kernel_name("Q6_K", 1, 4, 0, 1)
