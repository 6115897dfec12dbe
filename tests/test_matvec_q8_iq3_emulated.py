"""kernels/matvec_q8.py's IQ3_XXS integer-dot products (the decode matvec on dp4a over x quantized in two
int8 parts): Iq3XxsBlockInt8X over the file's blocks and Iq3XxsGroup4Int8X over IQ3_XXS_G4's
(kernels/iq3_groups.py), the fused-epilogue kernels over both (the layout's repack:
tests/test_kernels_iq.py). Their CUDA C on the host through tests/cuda_c_emulator.py, against float64
products of gguf-py's dequantize within the fp32 tolerance plus the x quantization's bound; on a GPU the
same at full size. The K types: tests/test_matvec_q8_emulated.py."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from matvec_q8_checks import ARGS, EPI_ARGS, _gpu, _iq3_source, _quantize, _x, assert_product_matches, quant_bound

from lite.kernels import iq3_groups, matvec_q8

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

# IQ3_XXS: Iq3XxsBlockInt8X on the register loop (matvec_q8's matvec_with_init: matvec_rows with the
# table fill) over quantized x, its tables (grid copies, sign masks) through L1, in shared memory or
# (the masks) computed; one on the persistent loop (matvec_persistent, "persistent" in the ids).
# (n, rows a CTA, prefetch, tables).
IQ3_KERNELS = [(1, 4, 0, (0, 0)), (1, 8, 0, (0, 0)), (2, 4, 0, (0, 0)), (1, 2, 1, (0, 0)), (1, 4, 0, (1, 1)),
               (1, 4, 0, (4, 2)), (2, 4, 0, (8, 2)), (1, 4, 0, (0, 2)), (1, 8, 1, (16, 1)), (1, 4, "persistent", (2, 2)), (2, 2, 0, (1, 2)), (2, 4, 1, (1, 2))]


# The grouped layout (matvec_q8's Iq3XxsGroup4Int8X over iq3_groups.repack's bytes: the GPU backend's).
IQ3_GROUPED = [(1, 4, 0, (1, 2)), (2, 4, 0, (0, 0)), (1, 8, 1, (32, 2)), (1, 4, 2, (1, 2)), (2, 2, 2, (1, 2)),
               (1, 4, 2, (1, 3)), (2, 4, 0, (1, 4)), (1, 4, 2, (32, 2))]


def _iq3_name(n, r, p, tables):
    from lite.kernels import matvec_iq
    if p == "persistent":
        return matvec_iq.persistent_name(matvec_q8.iq3_struct_name(tables), n, r)
    return matvec_q8.kernel_name("IQ3_XXS", n, r, p, tables)


@pytest.fixture(scope="module")
def iq3_lib():
    wraps = "".join(f'extern "C" __global__ void iq3q_{i}({ARGS}) {{ {_iq3_name(*k)}(w, x, out, rows, cols); }}\n'
                    for i, k in enumerate(IQ3_KERNELS))
    wraps += "".join(f'extern "C" __global__ void iq3g_{i}({ARGS}) {{ matvec_with_init<{matvec_q8.iq3_struct_name(t, True)}, '
                     f'{n}, {r}, {p}>(w, x, out, rows, cols); }}\n' for i, (n, r, p, t) in enumerate(IQ3_GROUPED))
    wraps += ('extern "C" __global__ void emu_qx_IQ3_XXS(const float* x, float* xq, int cols) '
              f'{{ {matvec_q8.quantize_name("IQ3_XXS")}(x, xq, cols); }}\n')
    return emu.compile_kernels(_iq3_source() + wraps)


@pytest.mark.parametrize("shape", [(37, 768), (11, 256 * 17)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("k", range(len(IQ3_KERNELS)), ids=lambda i: "n{}_{}_{}_t{}{}".format(*IQ3_KERNELS[i][:3], *IQ3_KERNELS[i][3]))
def test_iq3xxs_matvec_q8_matches_float64(iq3_lib, k, shape):
    """IQ3_XXS blocks (98 bytes: rows 2 bytes off a word for odd block counts) against float64 of
    gguf-py's dequantize, within the fp32 tolerance plus the x quantization's bound."""
    n, r, p, _ = IQ3_KERNELS[k]
    rows, cols = shape
    rng = np.random.default_rng(rows * 3 + n)
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    grid = (3,) if p == "persistent" else (-(-rows // r),)      # persistent: fewer CTAs than row groups, each walks several
    assert_product_matches(iq3_lib, f"iq3q_{k}", grid, blocks, blocks, "IQ3_XXS", _x(n, cols, rng), rows, cols)


@pytest.mark.parametrize("shape", [(37, 1024), (11, 2048), (5, 14336)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("k", range(len(IQ3_GROUPED)), ids=lambda i: "n{}_{}_{}_t{}{}".format(*IQ3_GROUPED[i][:3], *IQ3_GROUPED[i][3]))
def test_iq3xxs_grouped_layout_matches_float64(iq3_lib, k, shape):
    """Iq3XxsGroup4Int8X over the repacked bytes computes what the raw layout does: float64 of gguf-py's
    dequantize of the raw blocks, within the same bound."""
    n, r, _, _ = IQ3_GROUPED[k]
    rows, cols = shape
    rng = np.random.default_rng(rows * 5 + n)
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    packed = iq3_groups.repack(blocks, rows, cols)
    assert packed.nbytes == iq3_groups.nbytes(rows, cols) == blocks.nbytes * 408 // 392
    assert_product_matches(iq3_lib, f"iq3g_{k}", (-(-rows // r),), packed, blocks, "IQ3_XXS", _x(n, cols, rng), rows, cols)


@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU (the CUDA C text runs above under the emulator)")
def test_gpu_iq3xxs_matvec_q8_full_size():
    """4096x14336 and a ragged 37x2048 through matvec_iq.launch_cuda with int8_dot_types naming
    IQ3_XXS: within 1e-3 of float64 plus the x quantization's bound."""
    import cupy
    from lite.kernels import matvec_iq
    for rows, cols in ((4096, 14336), (37, 2048)):
        rng = np.random.default_rng(rows + 1)
        blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
        w = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
        for n in (1, 3):
            x = _x(n, cols, rng)
            ref, scale = x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ np.abs(w).T
            out = cupy.full((n, rows), np.nan, cupy.float32)
            matvec_iq.launch_cuda("IQ3_XXS", cupy.asarray(blocks), cupy.asarray(x), out, rows, cols, None,
                                  int8_dot_types=("Q4_K", "IQ3_XXS"))
            err = np.abs(out.get().astype(np.float64) - ref)
            assert np.all(err <= 1e-3 * np.abs(ref) + 1e-5 * scale + quant_bound("IQ3_XXS", x, w))


# matvec_fused_end over IQ3_XXS: the epilogue kernels on the IQ3 integer-dot structs, the file's layout and the
# regrouped one (kernels/iq3_groups.py), interleaved [gate; up] rows too.
IQ3_EPI_CASES = [(qt, n, e, nm, il) for qt in ("IQ3_XXS", "IQ3_XXS_G4") for n in (1, 3)
                 for e, nm, il in ((1, 0, False), (2, 0, False), (0, 2, False), (2, 2, False), (2, 0, True))]


@pytest.fixture(scope="module")
def iq3_epi_lib():
    from lite.kernels import matvec_epilogue
    from lite.kernels.matvec_epilogue import C_LAST_OF_COLUMN
    wraps = "".join(f'extern "C" __global__ void iepi_{qt}_{n}_{e}_{nm}_{int(il)}({EPI_ARGS}) {{ '
                    f'{matvec_epilogue.kernel_name(qt, n, *matvec_epilogue.config(qt, n, q8=True), e, nm, il, q8=True)}'
                    '(w, x, out, rows, cols, res, g, xg, part, scale, counter, eps); }\n'
                    for qt, n, e, nm, il in IQ3_EPI_CASES)
    wraps += ('extern "C" __global__ void emu_qx_IQ3_XXS(const float* x, float* xq, int cols) '
              f'{{ {matvec_q8.quantize_name("IQ3_XXS")}(x, xq, cols); }}\n')
    assert "Iq3XxsGroup4Int8X<" in wraps and "Iq3XxsBlockInt8X<" in wraps
    return emu.compile_kernels(_iq3_source() + "#undef R\n" + C_LAST_OF_COLUMN + matvec_epilogue.C_EPI + wraps)


@pytest.mark.parametrize("case", IQ3_EPI_CASES, ids=lambda c: f"{c[0]}-n{c[1]}-e{c[2]}-nm{c[3]}" + ("-il" if c[4] else ""))
def test_matvec_fused_end_iq3xxs_matches_float64(iq3_epi_lib, case):
    """The residual add, the gated activations (plain and interleaved rows) and the norm's scale in,
    at the end of IQ3_XXS's integer-dot product (both layouts): float64 of gguf-py's values, within the
    fp32 tolerance plus the x quantization's bound."""
    from lite.kernels import matvec_epilogue
    qt, n, e, nm, il = case
    units, cols = 19, 2048
    rows = units if e <= 1 else 2 * units
    rng = np.random.default_rng(300 + 10 * e + n + nm + il)
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    w = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
    order = matvec_epilogue.interleave_rows(units) if il else np.arange(rows)
    stored = blocks.reshape(rows, -1)[order].reshape(-1)            # the backend's row order
    if qt == "IQ3_XXS_G4":
        stored = iq3_groups.repack(stored, rows, cols)
    x = (rng.standard_normal((n, cols)) * 4 / np.sqrt((w * w).sum(1).max())).astype(np.float32)
    sc = (rng.random(n) + 0.5).astype(np.float32)
    k = sc[:, None] if nm == 2 else 1.0
    y, mag, bound = (x.astype(np.float64) @ w.T) * k, (np.abs(x).astype(np.float64) @ np.abs(w).T) * k, \
        quant_bound("IQ3_XXS", x.astype(np.float64), w) * k
    res = rng.standard_normal((n, rows)).astype(np.float32)
    width = rows if e <= 1 else units
    out = np.full((n, width), np.nan, np.float32)
    r = matvec_epilogue.config(qt, n, q8=True)[0]
    iq3_epi_lib.launch(f"iepi_{qt}_{n}_{e}_{nm}_{int(il)}", (-(-width // (r if e <= 1 else r // 2)),), (128,),
                       stored, _quantize(iq3_epi_lib, "IQ3_XXS", x), out, np.int32(rows), np.int32(cols), res,
                       None, None, None, sc, None, np.float32(0))
    if e <= 1:
        ref, tol = y + (res if e == 1 else 0), 1e-3 * mag + 1e-6 + bound
    else:
        g, u = y[:, :units], y[:, units:]
        act = g / (1 + np.exp(-g))
        ref = act * u
        tol = 2e-3 * (mag[:, :units] * np.abs(u) + np.abs(act) * mag[:, units:]) + 1e-6 \
            + 2 * (bound[:, :units] * np.abs(u) + np.abs(act) * bound[:, units:])
    assert np.all(np.abs(out - ref) <= tol), np.max(np.abs(out - ref) / tol)
