"""kernels/matvec_mma.py: IQ3_XXS's decode product on the tensor cores (bands16_product over IQ3_XXS_B16), its CUDA C
on the host through tests/cuda_c_emulator.py (the int8 mma emulated from the warp's fragments) against
float64 products of gguf-py's dequantize, within the x quantization's bound as the integer-dot product's (kernels/matvec_q8.py); the layout's
repack against the file's blocks; on a GPU the same at full size and through the registry."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from matvec_q8_checks import ARGS, _gpu, _iq3_source, _x, assert_product_matches

from lite.kernels import iq3_b16, matvec_mma, matvec_q8

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

# (warps a CTA, blocks loaded ahead, the signed table aligned in dynamic shared memory: on the GPU only, the
# emulator reads the static table either way) and SG (the odd chunk's signs by an add, no second mma)
CONFIGS = [(8, 1, 1, 0, 0), (8, 1, 1, 1, 1), (8, 1, 0, 0, 1), (4, 2, 1, 1, 0), (4, 2, 0, 0, 1), (2, 3, 0, 1, 1),
           (2, 1, 1, 0, 0)]
EPI_CONFIGS = [(8, 1, 1, 0, 0), (4, 2, 0, 1, 0), (8, 1, 1, 1, 1)]   # bands16_product_fused_end: config's two forms, and the product's predecode form
EPI_FORMS = [(e, nm) for e in (0, 1, 2, 3) for nm in (0, 2) if e or nm] + [(1, 1)]   # (epilogue, norm)


@pytest.fixture(scope="module")
def mma_lib():
    wraps = "".join(f'extern "C" __global__ void product_{w}_{p}_{a}_{sg}_{d}({ARGS}) '
                    f'{{ bands16_product<{w}, {p}, {a}, {sg}, {d}>(w, x, out, rows, cols); }}\n' for w, p, a, sg, d in CONFIGS)
    wraps += "".join(f'extern "C" __global__ void fused_end_{w}_{p}_{a}_{sg}_{d}_{e}_{nm}({ARGS}, const float* res, const float* g, '
                     f'float* xg, float* part, float* scale, int* counter, float eps, unsigned* xr) {{ bands16_product_fused_end<{w}, {p}, {a}, {sg}, {e}, {nm}, {d}>'
                     f'(w, x, out, rows, cols, res, g, xg, part, scale, counter, eps, xr); }}\n'
                     for w, p, a, sg, d in EPI_CONFIGS for e, nm in EPI_FORMS)
    wraps += ('extern "C" __global__ void emu_qx_IQ3_XXS(const float* x, float* xq, int cols) '
              f'{{ {matvec_q8.quantize_name("IQ3_XXS")}(x, xq, cols); }}\n')
    wraps += ('extern "C" __global__ void emu_qxe(const float* x, float* xq, int cols) '
              f'{{ {matvec_mma.QUANTIZER}(x, xq, cols); }}\n')
    return emu.compile_kernels(_iq3_source() + matvec_mma.c_source() + wraps)


def _decoded(records, rows, cols):
    """IQ3_XXS_B16 records read back as the kernel does (fields, indices and signs, scales, d) into
    float64 weights."""
    from lite.kernels import iq_tables
    grid = iq_tables.grid_values("IQ3_XXS").astype(np.float64)
    bands, nblk = rows // 16, cols // 256
    r = records.view(np.uint32).reshape(bands, nblk, 408)
    words = r[..., :384].reshape(bands, nblk, 3, 32, 4).transpose(0, 1, 3, 2, 4).reshape(bands, nblk, 32, 12)
    out = np.zeros((rows, cols))
    for b in range(bands):
        for j in range(nblk):
            for lane in range(32):
                g, q = lane >> 2, lane & 3
                wd = [int(v) for v in words[b, j, lane]]
                fields = sum(v << (32 * i) for i, v in enumerate(wd[:6]))
                for c in range(8):
                    for k in range(4):
                        n = 4 * (c >> 1) + k
                        if c % 2 == 0:
                            f = (fields >> (12 * n)) & 0xFFF
                            idx, signs = f & 255, f >> 8
                        else:
                            idx = (wd[6 + (c >> 1)] >> (8 * k)) & 255
                            signs = sum(((wd[10 + (n >> 3)] >> ((n & 7) + 8 * t)) & 1) << t for t in range(4))
                        row, word = 16 * b + g + 8 * (k & 1), q + 4 * (k >> 1)
                        sc = (int(r[b, j, 384 + 2 * g + (k & 1)]) >> (4 * c)) & 15
                        d = np.array([r[b, j, 400 + g] >> (16 * (k & 1)) & 0xFFFF], np.uint16).view(np.float16)[0]
                        sgn = np.where((signs >> np.arange(4)) & 1, -1.0, 1.0)
                        col = 256 * j + 32 * c + 4 * word
                        out[row, col:col + 4] = float(d) * (0.5 + sc) / 2 * grid[idx] * sgn
    return out


def test_repack_holds_the_file_blocks_weights():
    rows, cols = 32, 512
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, np.random.default_rng(7))
    records = iq3_b16.repack(blocks, rows, cols)
    assert records.nbytes == iq3_b16.nbytes(rows, cols) == blocks.nbytes * 102 // 98
    w = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
    assert np.array_equal(_decoded(records, rows, cols), w)


def test_bands16_quantizer_writes_x_records_words(mma_lib):
    """matvec_mma.QUANTIZER (quantize_x_early<.., 18>: x a block's words a lane) writes the x records' hi / lo words and d, each
    where bands16_product's lane reads it: lane L = 4 (4 (c & 1) + 2 run + lo) + w, word 4 L + pair; d at
    128 + 4 (2 (c & 1) + run) + pair."""
    cols = 1024
    x = _x(1, cols, np.random.default_rng(4))
    x[0, 32 * 5:32 * 5 + 16] = 0.0                         # a run of zeros (d = 0)
    a, b = np.zeros_like(x), np.zeros_like(x)
    mma_lib.launch("emu_qx_IQ3_XXS", matvec_q8.quantize_grid(1, cols), (128,), x, a, np.int32(cols))
    mma_lib.launch("emu_qxe", matvec_q8.quantize_grid(1, cols), (128,), x, b, np.int32(cols))
    rec = a.view(np.uint32).reshape(-1)[matvec_q8.record_words(cols // 32, 20, 0)].reshape(cols // 32, 20)
    got = b.view(np.uint32).reshape(-1)
    for c in range(cols // 32):
        j, pair, h = c // 8, (c % 8) // 2, c % 2
        for w in range(16):
            lane = 4 * (4 * h + 2 * ((w >> 2) & 1) + (w >> 3)) + (w & 3)
            assert got[144 * j + 4 * lane + pair] == rec[c, w], (c, w)
        for run in range(2):
            assert got[144 * j + 128 + 4 * (2 * h + run) + pair] == rec[c, 16 + 2 * run], (c, run)
    assert np.all(got[144 * (cols // 256):] == 0)          # 144 words a block: the rest untouched


def test_kernel_table_takes_the_layout_by_default():
    """`lite bench kernels` without types: every dequantize type and IQ3_XXS_B16 (a matvec only)."""
    from lite.kernels import bench
    from lite.kernels.registry import dequant_types
    types = bench.default_types()
    assert "IQ3_XXS_B16" in types and set(dequant_types()) <= set(types)


def test_repack_refuses_ragged_shapes():
    with pytest.raises(ValueError, match="multiple of 16"):
        iq3_b16.repack(np.zeros(37 * 98, np.uint8), 37, 256)


@pytest.mark.parametrize("shape", [(32, 512), (48, 768), (16, 2048), (32, 4096)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"w{c[0]}p{c[1]}a{c[2]}sg{c[3]}d{c[4]}")
def test_bands16_product_matches_float64(mma_lib, cfg, shape):
    """Against float64 of gguf-py's dequantize of the file's blocks, within 1e-3 plus the x
    quantization's bound; a CTA a band; 768 columns: 3 blocks, warps with none or a last lone one; 4096
    columns: the ring turns."""
    w, p, a, sg, d = cfg
    rows, cols = shape
    rng = np.random.default_rng(rows + cols + w)
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    records = iq3_b16.repack(blocks, rows, cols)
    x = _x(1, cols, rng)
    xq = np.zeros_like(x)
    mma_lib.launch("emu_qxe", matvec_q8.quantize_grid(1, cols), (128,), x, xq, np.int32(cols))
    assert_product_matches(mma_lib, f"product_{w}_{p}_{a}_{sg}_{d}", (rows // 16,), records, blocks, "IQ3_XXS", x, rows, cols,
                           threads=32 * w, xq=xq)


@pytest.mark.parametrize("nm", [0, 2], ids=["plain", "scale_in"])
@pytest.mark.parametrize("e", [0, 1, 2, 3], ids=["none", "add", "silu", "gelu_tanh"])
@pytest.mark.parametrize("cfg", EPI_CONFIGS, ids=lambda c: f"w{c[0]}p{c[1]}a{c[2]}sg{c[3]}d{c[4]}")
def test_bands16_product_fused_end_epilogues_match_float64(mma_lib, cfg, e, nm):
    """bands16_product_fused_end (bands16_product with the decode step's next op, kernels/cuda/mma_iq3_b16_body.cuh band_fused_end_write): the product (times the
    norm's scale with scale_in), plus res ("add") or act(gate) * up over [gate; up] rows interleaved (silu,
    gelu_tanh), against float64 within the product's bound carried through the op."""
    if not (e or nm):
        pytest.skip("that is bands16_product (test_bands16_product_matches_float64)")
    from matvec_q8_checks import quant_bound
    w_, p, a, sg, d = cfg
    rows, cols = 64, 1024
    rng = np.random.default_rng(17 + e + nm)
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    wf = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
    x = _x(1, cols, rng)
    xq = np.zeros_like(x)
    mma_lib.launch("emu_qxe", matvec_q8.quantize_grid(1, cols), (128,), x, xq, np.int32(cols))
    res = rng.standard_normal((1, rows)).astype(np.float32)
    scale = np.array([0.75], np.float32)
    k = float(scale[0]) if nm else 1.0
    prod = k * (x.astype(np.float64) @ wf.T)
    tol = k * (1e-3 * np.abs(x.astype(np.float64) @ wf.T) + 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(wf).T)
               + quant_bound("IQ3_XXS", x, wf))
    out = np.full((1, rows // 2 if e >= 2 else rows), np.nan, np.float32)
    z = np.zeros(1, np.float32)
    mma_lib.launch(f"fused_end_{w_}_{p}_{a}_{sg}_{d}_{e}_{nm}", (rows // 16,), (32 * w_,), iq3_b16.repack(blocks, rows, cols),
                   xq, out, np.int32(rows), np.int32(cols), res, z, z, z, scale, np.zeros(1, np.int32), np.float32(0), None)
    ref, bound = _epilogue_reference(e, prod, tol, res)
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= bound), np.max(err / bound)


def _epilogue_reference(e, prod, tol, res):
    """float64 reference and bound of bands16_product_fused_end's epilogue e over the product prod (within tol)."""
    if e <= 1:
        ref = prod + (res if e == 1 else 0.0)
        return ref, tol + 1e-6 * np.abs(ref)
    g, u, tg, tu = prod[:, 0::2], prod[:, 1::2], tol[:, 0::2], tol[:, 1::2]     # rows 2 u, 2 u + 1: gate u, up u
    if e == 2:
        act = g / (1.0 + np.exp(np.minimum(-g, 700.0)))
    else:
        act = 0.5 * g * (1.0 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))
    ref = act * u
    return ref, 1.2 * np.abs(u) * tg + (np.abs(act) + 1.2 * tg) * tu + 1e-5 * np.abs(ref) + 1e-6


@pytest.mark.parametrize("cfg", EPI_CONFIGS, ids=lambda c: f"w{c[0]}p{c[1]}a{c[2]}sg{c[3]}d{c[4]}")
def test_bands16_product_fused_end_norm_out_matches_float64(mma_lib, cfg):
    """bands16_product_fused_end's norm out ("add" with the next RMSNorm's first half): out = product + res, xg = out * g and scale =
    rsqrt(mean(out^2) + eps) from the CTAs' sums of squares (the last CTA's), against float64; twice, so that the
    counter the last CTA leaves at 0 serves again (a 9-band product: a partial round of every CTA shape)."""
    from matvec_q8_checks import quant_bound
    w_, p, a, sg, d = cfg
    rows, cols, eps = 144, 512, 1e-6
    rng = np.random.default_rng(29)
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    wf = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
    x = _x(1, cols, rng)
    xq = np.zeros_like(x)
    mma_lib.launch("emu_qxe", matvec_q8.quantize_grid(1, cols), (128,), x, xq, np.int32(cols))
    res = rng.standard_normal((1, rows)).astype(np.float32)
    g = rng.uniform(0.5, 1.5, rows).astype(np.float32)
    ref = x.astype(np.float64) @ wf.T + res
    tol = (1e-3 * np.abs(x.astype(np.float64) @ wf.T) + 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(wf).T)
           + quant_bound("IQ3_XXS", x, wf) + 1e-6 * np.abs(ref))
    counter = np.zeros(1, np.int32)
    for _ in range(2):
        out, xg = np.full((1, rows), np.nan, np.float32), np.full((1, rows), np.nan, np.float32)
        part, scale = np.full(rows // 16, np.nan, np.float32), np.full(1, np.nan, np.float32)
        mma_lib.launch(f"fused_end_{w_}_{p}_{a}_{sg}_{d}_1_1", (rows // 16,), (32 * w_,), iq3_b16.repack(blocks, rows, cols), xq,
                       out, np.int32(rows), np.int32(cols), res, g, xg, part, scale, counter, np.float32(eps), None)
        assert np.all(np.abs(out - ref) <= tol)
        assert np.all(np.abs(xg - ref * g) <= tol * g + 1e-6 * np.abs(ref * g))
        ms = np.mean(ref ** 2)
        want = 1.0 / np.sqrt(ms + eps)
        assert abs(scale[0] - want) <= want * (np.max(np.abs(ref) * tol) / ms + 1e-5), (scale[0], want)
        assert counter[0] == 0


@pytest.mark.parametrize("cfg", EPI_CONFIGS, ids=lambda c: f"w{c[0]}p{c[1]}a{c[2]}sg{c[3]}d{c[4]}")
def test_bands16_product_fused_end_norm_out_writes_the_next_products_x_records(mma_lib, cfg):
    """norm out with xr: the next product's x (xg = out * g) as matvec_mma.QUANTIZER's records, word for word
    what that quantizer writes from the xg this launch writes (zero runs and a tiny value included), so that
    the scale-in product after it needs no quantizer launch."""
    w_, p, a, sg, d = cfg
    rows, cols = 512, 256
    rng = np.random.default_rng(31)
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    x = _x(1, cols, rng)
    xq = np.zeros_like(x)
    mma_lib.launch("emu_qxe", matvec_q8.quantize_grid(1, cols), (128,), x, xq, np.int32(cols))
    res = rng.standard_normal((1, rows)).astype(np.float32)
    g = rng.uniform(0.5, 1.5, rows).astype(np.float32)
    g[32:48] = 0.0                                      # a run of zeros in xg (d = 0)
    g[70] = 1e-30                                       # tiny beside its run
    out, xg, xr = np.zeros((1, rows), np.float32), np.zeros((1, rows), np.float32), np.zeros((1, rows), np.float32)
    part, scale = np.zeros(rows // 16, np.float32), np.zeros(1, np.float32)
    mma_lib.launch(f"fused_end_{w_}_{p}_{a}_{sg}_{d}_1_1", (rows // 16,), (32 * w_,), iq3_b16.repack(blocks, rows, cols), xq,
                   out, np.int32(rows), np.int32(cols), res, g, xg, part, scale, np.zeros(1, np.int32),
                   np.float32(1e-6), xr)
    want = np.zeros_like(xg)
    mma_lib.launch("emu_qxe", matvec_q8.quantize_grid(1, rows), (128,), xg, want, np.int32(rows))
    n = 144 * rows // 256                               # layout 18's words of a row of rows values
    assert np.array_equal(xr.view(np.uint32)[0, :n], want.view(np.uint32)[0, :n])
    assert np.any(xr.view(np.uint32)[0, :n] != 0)


@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU (the CUDA C text runs above under the emulator)")
def test_gpu_bands16_product_fused_end_full_size():
    """matvec_mma.launch with each epilogue, scale_in and norm_out at 4096x14336 and 14336x4096 (config's two
    forms), against float64 as under the emulator."""
    import cupy
    from matvec_q8_checks import quant_bound
    for rows, cols in ((4096, 14336), (14336, 4096)):
        rng = np.random.default_rng(rows + 5)
        blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
        wf = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
        x = _x(1, cols, rng)
        records = iq3_b16.repack(cupy.asarray(blocks), rows, cols)
        res = rng.standard_normal((1, rows)).astype(np.float32)
        base = x.astype(np.float64) @ wf.T
        tol0 = 1e-3 * np.abs(base) + 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(wf).T) + quant_bound("IQ3_XXS", x, wf)
        for epi, e in (("add", 1), ("silu", 2), ("gelu_tanh", 3), (None, 0)):
            for k in ((None, 0.75) if e else (0.75,)):
                out = cupy.full((1, rows // 2 if e >= 2 else rows), np.nan, cupy.float32)
                matvec_mma.launch(records, cupy.asarray(x), out, rows, cols, epilogue=epi, res=cupy.asarray(res),
                                  scale_in=None if k is None else cupy.asarray(np.array([k], np.float32)))
                kk = 1.0 if k is None else k
                ref, bound = _epilogue_reference(e, kk * base, kk * tol0, res)
                err = np.abs(out.get().astype(np.float64) - ref)
                assert np.all(err <= bound), (rows, epi, k, float(np.max(err / bound)))
        g = cupy.asarray(rng.uniform(0.5, 1.5, rows).astype(np.float32))   # norm out, twice (the counter again)
        counter = cupy.zeros(1, cupy.int32)
        for _ in range(2):
            out, xg = cupy.empty((1, rows), cupy.float32), cupy.empty((1, rows), cupy.float32)
            part, scale = cupy.empty((1, rows // 16), cupy.float32), cupy.empty(1, cupy.float32)
            xr = cupy.zeros((1, rows), cupy.float32)
            matvec_mma.launch(records, cupy.asarray(x), out, rows, cols, epilogue="add", res=cupy.asarray(res),
                              norm_out=(g, 1e-6, xg, part, scale, counter), records_out=xr)
            quant = matvec_mma._module(cupy.cuda.runtime.getDevice(), (matvec_mma.QUANTIZER,),
                                       matvec_mma.module_head()).get_function(matvec_mma.QUANTIZER)
            want = cupy.zeros_like(xg)
            quant(matvec_q8.quantize_grid(1, rows), (128,), (xg, want, np.int32(rows)))
            n = 144 * rows // 256                       # the next product's x records: the quantizer's words
            assert cupy.array_equal(xr.view(cupy.uint32)[0, :n], want.view(cupy.uint32)[0, :n])
            nxt = iq3_b16.repack(cupy.asarray(random_blocks("IQ3_XXS", 256 * rows // 256, rng)), 256, rows)
            a, b = cupy.empty((1, 256), cupy.float32), cupy.empty((1, 256), cupy.float32)
            matvec_mma.launch(nxt, xg, a, 256, rows, scale_in=scale)                  # quantizes xg itself
            matvec_mma.launch(nxt, xg, b, 256, rows, scale_in=scale, x_records=xr)    # reads the records
            assert cupy.array_equal(a, b)
            ref, tol = base + res, tol0 + 1e-6 * np.abs(base + res)
            assert np.all(np.abs(out.get() - ref) <= tol) and np.all(np.abs(xg.get() - ref * g.get()) <= tol * 1.5 + 1e-6)
            ms = np.mean(ref ** 2)
            assert abs(float(scale.get()[0]) * np.sqrt(ms + 1e-6) - 1) <= np.max(np.abs(ref) * tol) / ms + 1e-5
            assert int(counter.get()[0]) == 0


@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU (the CUDA C text runs above under the emulator)")
def test_gpu_bands16_product_full_size():
    """4096x14336, 14336x4096 and 2 rows of x at 64x2048 through the registry's IQ3_XXS_B16 matvec and
    other CTA shapes, the records repacked on the GPU: within 1e-3 of float64 plus the x quantization's bound."""
    import cupy
    from matvec_q8_checks import quant_bound

    from lite.kernels.registry import get_matvec
    matvec = get_matvec("IQ3_XXS_B16")
    for rows, cols, n in ((4096, 14336, 1), (14336, 4096, 1), (64, 2048, 2)):
        rng = np.random.default_rng(rows + 3)
        blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
        w = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
        x = _x(n, cols, rng)
        ref, scale = x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ np.abs(w).T
        records = iq3_b16.repack(cupy.asarray(blocks), rows, cols)
        assert np.array_equal(records.get(), iq3_b16.repack(blocks, rows, cols))
        for cta in (None, (8, 2), (4, 1), (8, 1, 0), (4, 2, 1), (4, 2, 0, 1), (8, 1, 1, 1), (8, 1, 1, 1, 1), (8, 1, 0, 0, 1),
                    (4, 2, 0, 1, 1)):   # config's; others (the fifth: the first block decoded before the wait)
            out = cupy.full((n, rows), np.nan, cupy.float32)
            if cta is None:
                matvec(records, cupy.asarray(x), out, rows, cols)
            else:
                matvec_mma.launch(records, cupy.asarray(x), out, rows, cols, cta=cta)
            err = np.abs(out.get().astype(np.float64) - ref)
            assert np.all(err <= 1e-3 * np.abs(ref) + 1e-5 * scale + quant_bound("IQ3_XXS", x, w)), cta


@pytest.fixture(scope="module")
def dequant_lib():
    from cuda_c_emulator import HOST_SHIMS
    from matvec_q8_checks import Q8_SHIMS

    from lite.kernels import iq3_b16
    wraps = ('extern "C" __global__ void dequantize_bands16_f32(const unsigned char* w, float* out, int rows, '
             'int cols) '
             '{ dequantize_bands16<float>(w, out, rows, cols); }\n'
             'extern "C" __global__ void dequantize_bands16_f16(const unsigned char* w, unsigned short* out, '
             'int rows, int cols) '
             '{ dequantize_bands16<unsigned short>(w, out, rows, cols); }\n')
    return emu.compile_kernels(HOST_SHIMS + Q8_SHIMS + "inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }\n"
                               + iq3_b16.c_source() + wraps)


@pytest.mark.parametrize("shape", [(16, 256), (32, 1280)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_b16_dequantize_matches_gguf(dequant_lib, shape):
    """kernels/iq3_b16.py over the repacked records: gguf-py's dequantize of the file's blocks,
    exactly in fp32 and to fp16's rounding in fp16 (5 blocks a row: a CTA's last warps idle)."""
    from lite.kernels import iq3_b16
    rows, cols = shape
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, np.random.default_rng(rows + cols))
    records = iq3_b16.repack(blocks, rows, cols)
    ref = reference(blocks, "IQ3_XXS").astype(np.float32).reshape(rows, cols)
    out = np.full((rows, cols), np.nan, np.float32)
    dequant_lib.launch("dequantize_bands16_f32", *iq3_b16.launch_shape(rows, cols, np.float32), records, out,
                       np.int32(rows), np.int32(cols))
    assert np.array_equal(out, ref)
    out16 = np.zeros((rows, cols), np.uint16)
    dequant_lib.launch("dequantize_bands16_f16", *iq3_b16.launch_shape(rows, cols, np.float16), records, out16,
                       np.int32(rows), np.int32(cols))
    assert np.array_equal(out16.view(np.float16), ref.astype(np.float16))


@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU (the CUDA C text runs above under the emulator)")
def test_gpu_b16_dequantize_full_size():
    """kernels/iq3_b16.py on the GPU at 4096x14336, the records repacked there: gguf-py's values exactly in
    fp32, fp16's rounding in fp16."""
    import cupy

    from lite.kernels import iq3_b16
    rows, cols = 4096, 14336
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, np.random.default_rng(11))
    ref = reference(blocks, "IQ3_XXS").astype(np.float32).reshape(rows, cols)
    records = iq3_b16.repack(cupy.asarray(blocks), rows, cols)
    assert np.array_equal(iq3_b16.dequantize(records, rows, cols, np.float32).get(), ref)
    assert np.array_equal(iq3_b16.dequantize(records, rows, cols).get(), ref.astype(np.float16))
