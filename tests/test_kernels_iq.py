"""IQ quant kernels against gguf-py: dequantize exactly (fp32) / to fp16 rounding, fused matvec to 1e-3."""
import zlib

import numpy as np
import pytest

from kernel_blocks import random_blocks, reference, reference_f16
from lite import kernels as K
from lite.kernels import iq_tables, matvec_iq

IQ_TYPES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS"]


def _to_device(a):
    if K.SIMULATOR:
        return a
    import cupy
    return cupy.asarray(a)


def _to_host(a):
    return a if isinstance(a, np.ndarray) else a.get()


def test_ksigns_is_parity_completed_index():
    table = iq_tables.ksigns()
    assert [iq_tables.ksigns_formula(i) for i in range(128)] == table.tolist()
    assert all(bin(int(v)).count("1") % 2 == 0 for v in table)


@pytest.mark.parametrize("name,entries", [("IQ2_XXS", 256), ("IQ2_XS", 512), ("IQ2_S", 1024),
                                          ("IQ3_XXS", 256), ("IQ3_S", 512), ("IQ1_S", 2048)])
def test_packed_grid_unpacks_to_gguf_values(name, entries):
    packed = iq_tables.grid_packed(name)
    values = iq_tables.grid_values(name)
    assert packed.shape == (entries,)
    unpacked = packed.view(np.uint8).reshape(entries, -1).astype(np.float32)
    if name.startswith("IQ1"):
        unpacked -= 1
    np.testing.assert_array_equal(unpacked, values)


@pytest.mark.parametrize("name", IQ_TYPES)
def test_dequantize_matches_gguf(name):
    info = K.quant_info(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    n_blocks = 5 if info.block_elems == 256 else 12
    blocks = random_blocks(name, n_blocks, rng)
    dev = _to_device(blocks)
    out32 = _to_host(K.dequantize(dev, name, np.float32))
    np.testing.assert_array_equal(out32, reference(blocks, name))
    out16 = _to_host(K.dequantize(dev, name, np.float16))
    # bit patterns, so that -0.0 and +0.0 are told apart as the reference's cast makes them
    np.testing.assert_array_equal(out16.view(np.uint16), reference_f16(blocks, name).view(np.uint16))


@pytest.mark.parametrize("name", ["IQ3_XXS", "IQ4_XS"])
@pytest.mark.parametrize("n", [1, 3])
def test_matvec_matches_float64_reference(name, n):
    rng = np.random.default_rng(zlib.crc32(f"{name}{n}".encode()))
    rows, cols = 3, 512
    blocks = random_blocks(name, rows * cols // 256, rng)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    w = reference(blocks, name).astype(np.float64).reshape(rows, cols)
    expect = x.astype(np.float64) @ w.T
    got = _to_host(K.matvec(_to_device(blocks), name, _to_device(x), rows, cols))
    assert got.shape == (n, rows) and got.dtype == np.float32
    # relative to the size of the terms, so that a row whose scales are zero (a real case) counts
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T + 1e-30
    assert np.all(np.abs(got - expect) <= 1e-3 * scale)
    assert np.any(expect != 0)


def test_matvec_vector_x_and_bad_shapes():
    rng = np.random.default_rng(7)
    blocks = random_blocks("IQ4_XS", 2, rng)
    x = rng.standard_normal(256).astype(np.float32)
    got = _to_host(K.matvec(_to_device(blocks), "IQ4_XS", _to_device(x), 2, 256))
    expect = reference(blocks, "IQ4_XS").astype(np.float64).reshape(2, 256) @ x.astype(np.float64)
    np.testing.assert_allclose(got, expect, rtol=1e-3, atol=1e-3 * np.abs(expect).max())
    with pytest.raises(ValueError):
        K.matvec(_to_device(blocks), "IQ4_XS", _to_device(x[:128]), 2, 256)


@pytest.mark.skipif(K.SIMULATOR, reason="the CUDA C kernels run only on a GPU")
@pytest.mark.parametrize("name", ["IQ3_XXS", "IQ4_XS"])
def test_cuda_c_matches_numba_on_gpu(name, monkeypatch):
    import cupy
    rng = np.random.default_rng(11)
    rows, cols = 37, 2048                      # rows not a multiple of the 4 a CUDA block takes
    blocks = cupy.asarray(random_blocks(name, rows * cols // 256, rng))
    x = cupy.asarray(rng.standard_normal((5, cols)).astype(np.float32))
    from lite.kernels import matvec_iq, matvec_q8
    used, q8 = [], []
    real, real_q8 = matvec_iq.persistent_launch, matvec_q8.launch
    monkeypatch.setattr(matvec_iq, "persistent_launch", lambda *a, **k: used.append(1) or real(*a, **k))
    monkeypatch.setattr(matvec_q8, "launch", lambda *a, **k: q8.append(1) or real_q8(*a, **k))
    results = {}
    for impl in ("cuda", "numba"):
        ref = impl == "numba"
        results[impl] = (K.matvec(blocks, name, x, rows, cols, reference=ref).get(),
                         K.dequantize(blocks, name, np.float16, reference=ref).get())
    np.testing.assert_allclose(results["cuda"][0], results["numba"][0], rtol=1e-4,
                               atol=1e-4 * np.abs(results["numba"][0]).max())
    np.testing.assert_array_equal(results["cuda"][1].view(np.uint16), results["numba"][1].view(np.uint16))
    # IQ3_XXS: the integer-dot kernel (kernels/matvec_q8.py, the default) must have run
    assert bool(q8) == matvec_q8.applies(name), q8
    assert bool(used) == (not q8 and name == "IQ3_XXS"), used    # the persistent kernel for n = 1


@pytest.mark.skipif(K.SIMULATOR, reason="the CUDA C kernels run only on a GPU")
def test_iq3_xxs_cuda_c_kernels_match_float64():
    # IQ3_XXS's CUDA C kernels over float x, on 37 rows (not a multiple of any rows a CTA), n = 1, 2
    # and 3 (the persistent kernel takes n = 1; n = 2 and n = 3 = 2 + 1 the register kernel)
    import cupy
    rng = np.random.default_rng(13)
    rows, cols = 37, 2048
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    w = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
    expect = x.astype(np.float64) @ w.T
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T + 1e-30
    for n in (1, 2, 3):
        out = cupy.full((n, rows), np.nan, np.float32)
        matvec_iq.launch_cuda("IQ3_XXS", cupy.asarray(blocks), cupy.asarray(x[:n]), out, rows, cols, None,
                              int8_dot_types=())
        assert np.all(np.abs(out.get() - expect[:n]) <= 1e-5 * scale[:n] + 1e-4 * np.abs(expect[:n]))


def test_regrouped_iq3xxs_dequantizes_as_the_file_layout():
    """IQ3_XXS_G4 (kernels/iq3_groups.py: a row's blocks by fours, each field together, the signs
    placed): the same values as the file's blocks, whole rows and a row range (the embedding's
    lookups), exactly in fp32 and fp16. In CI the Numba kernel (dequant_iq._p_iq3_xxs_g4), on a GPU
    the CUDA C one."""
    from lite.kernels import iq3_groups
    rng = np.random.default_rng(41)
    rows, cols = 3, 2048
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    grouped = iq3_groups.repack(blocks, rows, cols)
    dev = _to_device(grouped)
    out32 = _to_host(K.dequantize(dev, iq3_groups.NAME, np.float32))
    np.testing.assert_array_equal(out32, reference(blocks, "IQ3_XXS"))
    out16 = _to_host(K.dequantize(dev, iq3_groups.NAME, np.float16))
    np.testing.assert_array_equal(out16.view(np.uint16), reference_f16(blocks, "IQ3_XXS").view(np.uint16))
    rb = grouped.size // rows                              # row 1 alone
    one = _to_host(K.dequantize(dev[rb:2 * rb], iq3_groups.NAME, np.float32))
    np.testing.assert_array_equal(one, reference(blocks, "IQ3_XXS")[cols:2 * cols])
    with pytest.raises(ValueError, match="groups of four"):              # not whole groups: refused
        K.dequantize(dev[:3 * 102], iq3_groups.NAME, np.float32)
    # blocks only 2-aligned (the CUDA C kernel reads 32-bit words): the Numba kernel, the same values
    shifted = _to_device(np.concatenate([np.zeros(2, np.uint8), grouped]))[2:]
    np.testing.assert_array_equal(_to_host(K.dequantize(shifted, iq3_groups.NAME, np.float32)),
                                  reference(blocks, "IQ3_XXS"))


def test_regrouped_iq3xxs_matvec_matches_float64_or_refuses():
    """The decode product of IQ3_XXS_G4 weights (qx + matvec_with_init<TIQ3_XXS_G4_INT8>) on the GPU, within the
    bound of the raw layout's; without the GPU kernels (CI) a clear error, never wrong numbers."""
    from lite.kernels import iq3_groups
    rng = np.random.default_rng(43)
    rows, cols = 5, 3072
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    dev, xd = _to_device(iq3_groups.repack(blocks, rows, cols)), _to_device(x)
    if not iq3_groups.applies():
        with pytest.raises(ValueError, match="integer-dot"):
            K.matvec(dev, iq3_groups.NAME, xd, rows, cols)
        return
    w = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
    expect = x.astype(np.float64) @ w.T
    got = _to_host(K.matvec(dev, iq3_groups.NAME, xd, rows, cols))
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T + 1e-30
    assert np.all(np.abs(got - expect) <= 1e-3 * scale)


def test_table_headers_match_gguf_tables():
    """kernels/cuda's table headers are gguf-py's tables as the generators write them."""
    from lite.kernels import dequant_iq, iq_tables
    from lite.kernels.cuda_source import source
    assert dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS") in source("iq3_grid.cuh")
    assert iq_tables.c_offset_tables() in source("iq3_offset_tables.cuh")
    kv = ", ".join(str(int(v)) for v in iq_tables.KVALUES_IQ4)
    assert f"__device__ const int IQ4_KVALUES[16] = {{{kv}}};" in source("iq4_values.cuh")
    m = iq_tables.sign_masks()
    masks = ", ".join(f"{{{int(a):#x}u, {int(b):#x}u}}" for a, b in m)
    assert f"IQ3XXS_SMASK2[128] = {{{masks}}};" in source("iq3_sign_masks.cuh")
    words = ", ".join(f"{int(v)}u" for v in iq_tables.table_words())
    assert f"= {{{words}}};" in source("iq3_signed_grid_words.cuh")
