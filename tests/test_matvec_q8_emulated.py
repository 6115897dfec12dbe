"""kernels/matvec_q8.py (the decode matvec on dp4a over x quantized in two int8 parts) for the K types: its
CUDA C on the host through tests/cuda_c_emulator.py, against float64 products of gguf-py's dequantize at
the 1e-3 the float kernels are held to; on a GPU the same at full size. Q4_K / Q6_K: the quantizer's
records (both layouts) decoded here and checked against x (the parts' ranges, the reconstruction bound
a / 64,516 of matvec_q8's docstring, the run sums); matvec_rows and the fused-epilogue kernels
(kernels/matvec_epilogue.py) over them; the MoE decode products (kernels/moe_products.py) over them
(IQ3_XXS's too). IQ3_XXS's own products: tests/test_matvec_q8_iq3_emulated.py; the helpers both use:
tests/matvec_q8_checks.py."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from cuda_c_emulator import HOST_SHIMS
from kernel_blocks import random_blocks, reference
from matvec_q8_checks import (ARGS, EPI_ARGS, Q8_SHIMS, _gpu, _quantize, _x, _xoff, assert_product_matches,
                              quant_bound)

from lite.kernels import matvec_cuda, matvec_q8, quant_info

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

Q8_TYPES = ["Q4_K", "Q6_K"]          # on matvec_cuda's structs; IQ3_XXS: test_matvec_q8_iq3_emulated.py
# (type, wrapper, n, rows a CTA, prefetch)
KERNELS = [(qt, f"emu_q8_{qt}_{n}_{r}_{p}", n, r, p) for qt in Q8_TYPES
           for n, r, p in ((1, 8, 0), (2, 8, 0), (1, 4, 1), (2, 4, 0), (1, 2, 0), (3, 2, 0))]
SHAPES = [(37, 768), (11, 256 * 17)]   # ragged row groups; 136 chunks: a second trip with idle threads


@pytest.fixture(scope="module", params=[0, 1], ids=["layout0", "layout1"])
def lib(request):
    """The K types' quantizer and matvec_rows kernels over quantized x, in record layout 0 or 1 (both sizes)."""
    wraps = "".join(f'extern "C" __global__ void {name}({ARGS}) {{ '
                    f'{matvec_q8.kernel_name(qt, n, r, p)}(w, x, out, rows, cols); }}\n'
                    for qt, name, n, r, p in KERNELS)
    wraps += "".join(f'extern "C" __global__ void emu_qx_{qt}(const float* x, float* xq, int cols) '
                     f'{{ {matvec_q8.quantize_name(qt)}(x, xq, cols); }}\n' for qt in Q8_TYPES)
    source = (HOST_SHIMS + Q8_SHIMS + matvec_cuda.C_HEAD + matvec_cuda.C_TYPES + matvec_cuda.C_KERNEL
              + f"#define LT_Q8_LAYOUT20 {request.param}\n#define LT_Q8_LAYOUT24 {request.param}\n"
              + matvec_q8.C_Q8 + wraps)
    lib = emu.compile_kernels(source)
    lib.layout = request.param
    return lib


@pytest.mark.parametrize("qt", Q8_TYPES)
def test_quantized_x_records(lib, qt):
    rng = np.random.default_rng(3)
    n, cols = 2, 768
    x = _x(n, cols, rng)
    for k in range(4):                                  # chunk 3's run a: zeros (d = 0)
        x[:, _xoff(qt, 3, k) + np.arange(4)] = 0.0
    rw = matvec_q8.TYPES[qt][2]
    xq = _quantize(lib, qt, x)
    c = np.arange(cols // 32)
    cols_of = np.stack([_xoff(qt, c, k)[:, None] + np.arange(4) for k in range(8)], 1).reshape(-1, 2, 16)
    rec = xq.reshape(n, -1)[:, matvec_q8.record_words(cols // 32, rw, lib.layout)]     # (n, chunks, rw)
    ints = rec[:, :, :16].copy().view(np.int8).reshape(n, -1, 4, 16).astype(np.int64)   # ha hb la lb
    f = rec[:, :, 16:]
    for i in range(n):
        for run in (0, 1):
            hi, lo = ints[i, :, run], ints[i, :, 2 + run]
            d = (f[i, :, 2 * run] if rw == 20 else f[i, :, run]).astype(np.float64)
            xs = x[i][cols_of[:, run]].astype(np.float64)
            a = np.abs(xs).max(axis=1)
            assert np.all(np.abs(hi) <= 127) and np.all(np.abs(lo) <= 127)
            np.testing.assert_allclose(d, a / (127 * 254), rtol=1e-6)
            assert run == 1 or d[3] == 0.0
            err = np.abs(d[:, None] * (254 * hi + lo) - xs)
            assert np.all(err <= a[:, None] / 64516 * (1 + 1e-4) + 1e-37), err.max()
            xhat = d[:, None] * (254 * hi + lo)    # the sums are of the quantized x (one rounding)
            if rw == 20:
                np.testing.assert_allclose(f[i, :, 2 * run + 1], xhat.sum(axis=1), rtol=1e-6, atol=1e-37)
            else:                              # sums of the 8-value halves (Q6_K's scale runs)
                for h in (0, 1):
                    np.testing.assert_allclose(f[i, :, 2 + 2 * run + h], xhat[:, 8 * h:8 * h + 8].sum(axis=1),
                                               rtol=1e-6, atol=1e-37)
    assert not np.any(ints[:, 3, 0]) and not np.any(ints[:, 3, 2])     # the zero run: hi = lo = 0


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k[1])
def test_matvec_q8_matches_float64(lib, kernel, shape):
    qt, name, n, rows_per_cta, _ = kernel
    rows, cols = shape
    rng = np.random.default_rng(rows + n)
    blocks = random_blocks(qt, rows * cols // quant_info(qt).block_elems, rng)
    assert_product_matches(lib, name, (-(-rows // rows_per_cta),), blocks, blocks, qt, _x(n, cols, rng), rows, cols)


def test_unknown_type_is_a_clear_error():
    with pytest.raises(ValueError, match="Q8_0"):
        matvec_q8.launch("Q8_0", None, np.zeros((1, 256), np.float32), None, None, 1, 256)



@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU (the CUDA C text runs above under the emulator)")
@pytest.mark.parametrize("config", [(8, 0), (4, 1), (2, 0)])
@pytest.mark.parametrize("qt", Q8_TYPES)
def test_gpu_matvec_q8_full_size_against_float64_and_matvec_rows(qt, config):
    """4096x14336 (the issue's shape) and a ragged 37x2048, n = 1, 2, 3: within 1e-3 of float64 and
    close to the float kernel."""
    import cupy
    for rows, cols in ((4096, 14336), (37, 2048)):
        rng = np.random.default_rng(rows)
        blocks = random_blocks(qt, rows * cols // 256, rng)
        w = reference(blocks, qt).astype(np.float64).reshape(rows, cols)
        for n in (1, 2, 3):
            x = _x(n, cols, rng)
            ref, scale = x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ np.abs(w).T
            b, xd = cupy.asarray(blocks), cupy.asarray(x)
            out, xq = cupy.full((n, rows), np.nan, cupy.float32), cupy.empty_like(xd)
            matvec_q8.launch(qt, b, xd, xq, out, rows, cols, config)
            flt = cupy.empty_like(out)
            matvec_cuda.launch(qt, b, xd, flt, rows, cols, cta=matvec_cuda.CONFIG[qt], int8_dot_types=())
            got, flt = out.get().astype(np.float64), flt.get().astype(np.float64)
            bound = quant_bound(qt, x, w)
            assert np.all(np.abs(got - ref) <= 1e-3 * np.abs(ref) + 1e-5 * scale + bound)
            assert np.all(np.abs(got - flt) <= 1e-3 * np.abs(flt) + 1e-5 * scale + bound)


# matvec_fused_end (kernels/matvec_epilogue.py) over quantized x: what the decode step runs by default.
EPI_CASES = [(qt, n, e, nm) for qt in Q8_TYPES for n in (1, 3) for e, nm in ((1, 0), (2, 0), (3, 0), (0, 2), (2, 2))]


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def epi_lib(monkeypatch_module):
    from lite.kernels import matvec_epilogue
    wraps = "".join(f'extern "C" __global__ void epi_{qt}_{n}_{e}_{nm}({EPI_ARGS}) {{ '
                    f'{matvec_epilogue.kernel_name(qt, n, *matvec_epilogue.config(qt, n), e, nm)}'
                    '(w, x, out, rows, cols, res, g, xg, part, scale, counter, eps); }\n'
                    for qt, n, e, nm in EPI_CASES)
    wraps += "".join(f'extern "C" __global__ void emu_qx_{qt}(const float* x, float* xq, int cols) '
                     f'{{ {matvec_q8.quantize_name(qt)}(x, xq, cols); }}\n' for qt in Q8_TYPES)
    assert "TQ4_KQ" in wraps and "TQ6_KQ" in wraps
    return emu.compile_kernels(HOST_SHIMS + Q8_SHIMS + matvec_epilogue.c_source(q8=True) + wraps)


@pytest.mark.parametrize("case", EPI_CASES, ids=lambda c: f"{c[0]}-n{c[1]}-e{c[2]}-nm{c[3]}")
def test_matvec_fused_end_over_quantized_x_matches_float64(epi_lib, case):
    qt, n, e, nm = case
    units, cols = 19, 768
    rows = units if e <= 1 else 2 * units
    rng = np.random.default_rng(100 + 10 * e + n + nm)
    blocks = random_blocks(qt, rows * cols // 256, rng)
    w = reference(blocks, qt).astype(np.float64).reshape(rows, cols)
    x = (rng.standard_normal((n, cols)) * 4 / np.sqrt((w * w).sum(1).max())).astype(np.float32)
    sc = (rng.random(n) + 0.5).astype(np.float32)          # scale in (nm = 2): totals times scale[n]
    y = (x.astype(np.float64) @ w.T) * (sc[:, None] if nm == 2 else 1.0)
    mag = (np.abs(x).astype(np.float64) @ np.abs(w).T) * (sc[:, None] if nm == 2 else 1.0)
    bound = quant_bound(qt, x.astype(np.float64), w) * (sc[:, None] if nm == 2 else 1.0)
    res = rng.standard_normal((n, rows)).astype(np.float32)
    width = rows if e <= 1 else units
    out = np.full((n, width), np.nan, np.float32)
    r = matvec_q8.config(qt)[0]
    epi_lib.launch(f"epi_{qt}_{n}_{e}_{nm}", (-(-width // (r if e <= 1 else r // 2)),), (128,), blocks,
                   _quantize(epi_lib, qt, x), out, np.int32(rows), np.int32(cols), res, None, None, None, sc,
                   None, np.float32(0))
    if e <= 1:
        ref, tol = y + (res if e == 1 else 0), 1e-3 * mag + 1e-6 + bound
    else:
        g, u = y[:, :units], y[:, units:]
        act = g / (1 + np.exp(-g)) if e == 2 else 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))
        ref = act * u
        tol = 2e-3 * (mag[:, :units] * np.abs(u) + np.abs(act) * mag[:, units:]) + 1e-6 \
            + 2 * (bound[:, :units] * np.abs(u) + np.abs(act) * bound[:, units:])
    assert np.all(np.abs(out - ref) <= tol), np.max(np.abs(out - ref) / tol)


def test_q8_switch_routes_the_decode_products():
    """The types int8_dot_types names take TQ*_KQ and matvec_q8's CTA shape; others the float structs."""
    from lite.kernels import matvec_epilogue
    assert not matvec_q8.applies("Q4_K", ()) and matvec_q8.applies("Q4_K", ("Q4_K",))
    assert not matvec_q8.applies("Q6_K", ("Q4_K",)) and matvec_q8.applies("IQ3_XXS_G4", ())
    assert matvec_q8.applies_moe("Q4_K") and not matvec_q8.applies_moe("Q4_K", moe_int8_dot=False)
    assert "TQ4_KQ" not in matvec_epilogue.kernel_name("Q4_K", 1, 8, 0, 1, q8=False)
    assert matvec_epilogue.config("Q4_K", 1, q8=False) == matvec_cuda.CONFIG["Q4_K"]
    assert matvec_epilogue.kernel_name("Q4_K", 1, 2, 0, 1, q8=True).startswith("matvec_fused_end<TQ4_KQ, 1, 2, 0, 1")
    assert matvec_epilogue.config("Q4_K", 1, q8=True) == matvec_q8.config("Q4_K")
    assert matvec_epilogue.config("Q6_K", 1, q8=False) == matvec_cuda.CONFIG["Q6_K"]
    assert "TQ6_K," in matvec_epilogue.kernel_name("Q6_K", 1, 4, 0, 1, q8=False)


def test_kernel_names_tell_which_modules_need_the_integer_structs(monkeypatch):
    """matvec_epilogue's and moe_products' kernel caches build a module's source from the kernel's name:
    every integer struct's name, IQ3_XXS's included, must ask for structs(); float names must not.
    (IQ3_XXS_G4, the regrouped layout, has dense products only: experts keep the file's layout.)"""
    from lite.kernels import matvec_epilogue, moe_products
    for qt in matvec_q8.DEFAULT_TYPES:
        assert matvec_q8.in_name(moe_products.decode_name(qt, 768, int8=True))
        assert matvec_q8.in_name(moe_products.decode_name(qt, 2048, "silu", int8=True))
    assert matvec_q8.in_name(matvec_epilogue.kernel_name("Q4_K", 1, 2, 0, 1))
    assert matvec_q8.in_name(matvec_q8.kernel_name("IQ3_XXS_G4", 1, 4, 0))
    assert "Iq3XxsGroup4Int8X<" in matvec_q8.kernel_name("IQ3_XXS_G4", 1, 4, 0)
    monkeypatch.setattr(matvec_q8, "applies_moe", lambda *a, **k: False)   # (moe_products: moe_int8_dot off)
    for qt in matvec_q8.DEFAULT_TYPES:
        assert not matvec_q8.in_name(moe_products.decode_name(qt, 768, int8=False))
    assert not matvec_q8.in_name(matvec_epilogue.kernel_name("Q4_K", 1, 8, 0, 1, q8=False))


# the MoE decode product (kernels/moe_products.py) over quantized x (int8=True; BackendConfig.moe_int8_dot): the MoE decode experts.
MOE_ARGS = ("const unsigned char* w0, const unsigned char* w1, long long ebytes, const int* slot_of, "
            "const float* x, float* out0, float* out1, const int* blk_expert, const int* blk_rows, "
            "int kdiv, int S, int rows, int cols, int x_by_row")


@pytest.fixture(scope="module", params=["K", "IQ3_XXS"])
def moe_lib(request, monkeypatch_module):
    """moe_products' decode kernels over quantized x: the K types' module, or IQ3_XXS's (its own structs and tables)."""
    from lite.kernels import moe_products
    types = Q8_TYPES if request.param == "K" else ["IQ3_XXS"]
    wraps = ""
    for qt in types:
        for cols in (512, 768):
            for act in (None, "silu"):
                wraps += (f'extern "C" __global__ void moe_{qt}_{cols}_{act}({MOE_ARGS}) {{ '
                          f'{moe_products.decode_name(qt, cols, act, int8=True)}(w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, '
                          'blk_rows, kdiv, S, rows, cols, x_by_row); }\n')
        wraps += (f'extern "C" __global__ void emu_qx_{qt}(const float* x, float* xq, int cols) '
                  f'{{ {matvec_q8.quantize_name(qt)}(x, xq, cols); }}\n')
    assert all(matvec_q8.struct(qt) + "," in wraps for qt in types)
    head = "" if request.param == "K" else (
        "#define GCOPIES 0\ninline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }\n")
    src = HOST_SHIMS + Q8_SHIMS + head + moe_products.decode_source(types[0], host=True, int8=True) + wraps
    return types, emu.compile_kernels(src)


@pytest.mark.parametrize("cols", (512, 768))
@pytest.mark.parametrize("qt", Q8_TYPES + ["IQ3_XXS"])
def test_moe_decode_product_over_quantized_x_matches_float64(moe_lib, monkeypatch_module, qt, cols):
    """Decode's expert products: gate and up in the gated form (silu) over the tokens' quantized x,
    down (x_by_row) over the slots' quantized rows; 3 tokens, 2 experts each of 4, 37 rows."""
    from lite.kernels import moe_products
    types, moe_lib = moe_lib
    if qt not in types:
        pytest.skip("in the other module")
    rng = np.random.default_rng(cols + len(qt))
    E, K, T, rows = 4, 2, 3, 37
    S = T * K
    wg, wu = (random_blocks(qt, E * rows * cols // 256, rng) for _ in range(2))
    Wg, Wu = (reference(b, qt).astype(np.float64).reshape(E, rows, cols) for b in (wg, wu))
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32).reshape(-1)
    x = (rng.standard_normal((T, cols)) * 2 / np.sqrt((Wg * Wg).sum(-1).max())).astype(np.float32)
    a = _x(S, cols, rng)
    xq, aq = _quantize(moe_lib, qt, x), _quantize(moe_lib, qt, a)
    args = (None, np.int32(K), np.int32(S), np.int32(rows), np.int32(cols))
    g = np.full((S, rows), np.nan, np.float32)
    moe_lib.launch(f"moe_{qt}_{cols}_silu", (-(-rows // moe_products.decode_rows_per_cta(qt, cols, "silu")), S),
                   (moe_products.THREADS,), wg, wu, np.int64(wg.size // E), None, xq, g, None, ids, *args, np.int32(0))
    y = np.full((S, rows), np.nan, np.float32)
    moe_lib.launch(f"moe_{qt}_{cols}_None", (-(-rows // moe_products.decode_rows_per_cta(qt, cols)), S),
                   (moe_products.THREADS,), wg, None, np.int64(wg.size // E), None, aq, y, None, ids, *args, np.int32(1))
    for i in range(S):
        e, t = ids[i], i // K
        gv, uv = Wg[e] @ x[t], Wu[e] @ x[t]
        sg = gv / (1 + np.exp(-gv))                  # silu(gate); act's slope in up
        act = sg * uv
        mg, mu = np.abs(Wg[e]) @ np.abs(x[t]), np.abs(Wu[e]) @ np.abs(x[t])
        bg, bu = (quant_bound(qt, x[t:t + 1].astype(np.float64), W[e])[0] for W in (Wg, Wu))
        tol = 2e-3 * (mg * np.abs(uv) + np.abs(sg) * mu) + 2 * (bg * np.abs(uv) + np.abs(sg) * bu) + 1e-6
        assert np.all(np.abs(g[i] - act) <= tol), np.max(np.abs(g[i] - act) / tol)
        want = Wg[e] @ a[i]
        err = np.abs(y[i] - want)
        bound = quant_bound(qt, a[i:i + 1].astype(np.float64), Wg[e])[0]
        assert np.all(err <= 1e-3 * np.abs(want) + 1e-5 * (np.abs(Wg[e]) @ np.abs(a[i])) + bound)
