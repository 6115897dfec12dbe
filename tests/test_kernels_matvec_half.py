"""The half2 decode matvec `mvh` (kernels/matvec_half.py, Q4_K and Q6_K) against float64.

Here its CUDA C text runs on the host through tests/cuda_c_emulator.py, with f16x2 arithmetic
modelled by _Float16 (each HFMA2 / HSUB2 result rounded once, as the hardware does). The GPU test at
the bottom (skipped without a GPU) checks the same thing through matvec_cuda.launch; it passed on
the H200 in session 3.

Tolerance, and why: the fp32 kernels are held to 1e-3 of each result plus 1e-5 of sum |x w|
(tests/test_kernels_matvec.py). Products summed in fp16 (11 significant bits, unit roundoff
u = 2^-11 = 4.9e-4) carry an error that scales with the sum of |x q'| d sc over the row, q' the
value AS THE KERNEL CENTRES IT (Q4_K: q - 8, whatever the block's minimum; Q6_K: q - 32, the
weight itself), not with |w|: a Q4_K weight near zero because its minimum cancels d sc q still
costs an fp16 product of size d sc |q - 8|. A run of k HFMA2 (k = 8 for Q4_K, 4 for Q6_K) plus the
rounding of x adds at most (k + 1) u (4.4e-3, 2.4e-3) of its sum |x q'| d sc, typically a few u
when one run dominates an output and far less when many runs average. Bound per output:
1e-3 |result| + 2e-3 sum |x q'| d sc (measured max 9.6e-4 of the latter here, over 8 seeds with
the extreme activations of _x). On typical activations (normal with x100 outliers) the
root-mean-square error must also stay below 1e-3 of the root-mean-square result (measured
1.7e-4 to 6.3e-4): the level that keeps the GPU = CPU logit tests (1e-2 relative) far away.
"""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from test_kernels_matvec_emulated import HOST_SHIMS

from lite.kernels import matvec_cuda, matvec_half, quant_info

# half2 at the bit level for the kernel's host path (LITE_HOST_SHIM), on the emulator's __half2
HALF_SHIMS = r"""
inline __half2 lt_bits_h2(unsigned u) { __half2 h; std::memcpy(&h, &u, 4); return h; }
inline unsigned lt_h2_bits(__half2 h) { unsigned u; std::memcpy(&u, &h, 4); return u; }
inline unsigned lt_host_hfma2(unsigned a, unsigned b, unsigned c) {
    return lt_h2_bits(__hfma2(lt_bits_h2(a), lt_bits_h2(b), lt_bits_h2(c))); }
inline unsigned lt_host_hsub2(unsigned a, unsigned b) { return lt_h2_bits(__hsub2(lt_bits_h2(a), lt_bits_h2(b))); }
inline unsigned lt_host_hadd2(unsigned a, unsigned b) { return lt_h2_bits(__hadd2(lt_bits_h2(a), lt_bits_h2(b))); }
inline unsigned lt_host_f2h2(float lo, float hi) { return lt_h2_bits(__floats2half2_rn(lo, hi)); }
"""
ARGS = "const unsigned char* w, const float* x, float* out, int rows, int cols"
# rows: 37 is no multiple of any rows a CTA; Q4_K 33 blocks a row (132 chunks of 64 weights: some
# threads take two loop trips), Q6_K 5 blocks of 210 bytes, so rows start 2 bytes off a word.
SHAPES = {"Q4_K": (37, 256 * 33), "Q6_K": (37, 256 * 5)}
KERNELS = [(qt, n, r, ch) for qt in matvec_half.TYPES for ch in matvec_half.CHUNKS[qt] for n in (1, 2) for r in (4, 8)]

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")


def _wrapper_name(qt, n, r, ch):
    return f"emu_{qt}_{n}_{r}_{ch}"


@pytest.fixture(scope="module")
def lib():
    calls = "".join(
        f'extern "C" __global__ void {_wrapper_name(*k)}({ARGS}) '
        f'{{ {matvec_half.kernel_name(*k)}(w, x, out, rows, cols); }}\n' for k in KERNELS)
    source = (HOST_SHIMS + HALF_SHIMS + matvec_cuda.C_HEAD + matvec_cuda.C_TYPES + matvec_half.C_HALF + calls)
    return emu.compile_kernels(source)


def _x(n, cols, rng):
    """Activations with the cases the per-chunk fp16 scaling must survive: outliers every 7th
    column (x100), a chunk of zeros, one of 3e4 (products would overflow fp16 unscaled), one of
    1e-6 (would fall to fp16 subnormals unscaled), one mixing 1e3 with 1e-3."""
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::7] *= 100.0
    x[:, 256:288] = 0.0
    x[:, 512:544] *= 3e4
    x[:, 768:800] *= 1e-6
    x[:, 1024:1056:2] *= 1e3
    x[:, 1025:1056:2] *= 1e-3
    return x


def _centred(blocks, qt):
    """(elements,) float64: d sc q' (see the docstring) from the reference dequantization: Q4_K
    with dmin zeroed, minus the same with every nibble 8; Q6_K the weights themselves."""
    if qt == "Q6_K":
        return reference(blocks, qt).astype(np.float64)
    b = blocks.reshape(-1, quant_info(qt).type_size).copy()
    b[:, 2:4] = 0                                   # dmin = +0
    w = reference(b.reshape(-1), qt).astype(np.float64)
    b[:, 16:] = 0x88                                # every value 8
    return w - reference(b.reshape(-1), qt).astype(np.float64)


def _problem(qt, n, seed, extreme=True):
    """blocks, x, float64 result, and the fp16 error scale sum |x q'| d sc per output."""
    rows, cols = SHAPES[qt]
    rng = np.random.default_rng(seed)
    blocks = random_blocks(qt, rows * cols // quant_info(qt).block_elems, rng)
    if extreme:
        x = _x(n, cols, rng)
    else:
        x = rng.standard_normal((n, cols)).astype(np.float32)
        x[:, ::7] *= 100.0
    w = reference(blocks, qt).astype(np.float64).reshape(rows, cols)
    centred = np.abs(_centred(blocks, qt)).reshape(rows, cols)
    return blocks, x, x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ centred.T


def check(out, ref, scale16):
    """The per-output fp16 bound of the module docstring."""
    out = np.asarray(out, np.float64)
    assert np.all(np.isfinite(out))
    err = np.abs(out - ref)
    assert np.all(err <= 1e-3 * np.abs(ref) + 2e-3 * scale16), np.max(err / scale16)


def _run(lib, qt, n, r, blocks, x, ch=32):
    rows, cols = SHAPES[qt]
    out = np.full((n, rows), np.nan, np.float32)
    lib.launch(_wrapper_name(qt, n, r, ch), (-(-rows // r),), (128,), blocks, x, out, np.int32(rows), np.int32(cols))
    return out


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: f"{k[0]}-n{k[1]}-r{k[2]}-c{k[3]}")
def test_emulated_half2_matvec_matches_float64(lib, kernel):
    qt, n, r, ch = kernel
    blocks, x, ref, scale16 = _problem(qt, n, seed=11 * n + r + len(qt))
    check(_run(lib, qt, n, r, blocks, x, ch), ref, scale16)


@pytest.mark.parametrize("qt,ch", [(qt, ch) for qt in matvec_half.TYPES for ch in matvec_half.CHUNKS[qt]])
def test_emulated_half2_matvec_rms_error_on_typical_activations(lib, qt, ch):
    blocks, x, ref, scale16 = _problem(qt, 2, seed=21, extreme=False)
    out = _run(lib, qt, 2, 4, blocks, x, ch)
    check(out, ref, scale16)
    assert np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref ** 2)) < 1e-3


@pytest.mark.parametrize("qt", matvec_half.TYPES)
def test_emulated_half2_matvec_all_zero_and_huge_x(lib, qt):
    # x = 0 everywhere (the scale's exponent clamp) and x near fp32's top (no overflow to inf)
    rows, cols = SHAPES[qt]
    blocks, _, _, _ = _problem(qt, 1, seed=3)
    w = reference(blocks, qt).astype(np.float64).reshape(rows, cols)
    centred = np.abs(_centred(blocks, qt)).reshape(rows, cols)
    for v in (0.0, 1e30):
        x = np.zeros((1, cols), np.float32)
        x[0, ::5] = v
        for ch in matvec_half.CHUNKS[qt]:
            check(_run(lib, qt, 1, 8, blocks, x, ch), x.astype(np.float64) @ w.T,
                  np.abs(x).astype(np.float64) @ centred.T)


def test_half2_kernel_is_planned_only_where_it_exists():
    # pure host logic: which kernel a launch with config ("mvh", rows) gets
    mc = matvec_cuda
    assert mc._plan("Q4_K", ("mvh", 8), 1, staged_ok=False) == ("mvh", 8)
    assert mc._plan("Q6_K", ("mvh", 4), 2, staged_ok=True) == ("mvh", 4)
    assert mc._plan("Q4_K", ("mvh", 8), 3, staged_ok=True) == ("mv", 4) + mc.CONFIG["Q4_K"][1:]
    assert mc._plan("Q8_0", ("mvh", 8), 1, staged_ok=True) == ("mv",) + mc.CONFIG["Q8_0"]
    assert mc.kernel_name("Q4_K", 1, "mvh", 8) == "mvh<HQ4_K, 1, 8>"
    assert mc.kernel_name("Q6_K", 2, "mvh", 4) == "mvh<HQ6_K, 2, 4>"
    assert mc._plan("Q4_K", ("mvh", 8, 64), 1, staged_ok=True) == ("mvh", 8, 64)
    assert mc._plan("Q6_K", ("mvh", 8, 64), 1, staged_ok=True) == ("mv",) + mc.CONFIG["Q6_K"]
    assert mc.kernel_name("Q4_K", 1, "mvh", 8, 64) == "mvh<HQ4_K64, 1, 8>"
    assert "mvh" in mc.c_source(half=True) and "mvh" not in mc.c_source()


def _gpu():
    from conftest import HAS_GPU
    return HAS_GPU


@pytest.mark.skipif(not _gpu(), reason="the CUDA C kernels run only on a GPU")
@pytest.mark.parametrize("qtype", matvec_half.TYPES)
def test_gpu_half2_matvec_through_launch(qtype):
    import cupy
    blocks, x, ref, scale16 = _problem(qtype, 3, seed=5)
    rows, cols = SHAPES[qtype]
    b, xd = cupy.asarray(blocks), cupy.asarray(x)
    for r in (4, 8):
        for ch in matvec_half.CHUNKS[qtype]:
            for n in (1, 2, 3):     # n = 3 takes the register kernel
                out = cupy.full((n, rows), np.nan, np.float32)
                matvec_cuda.launch(qtype, b, xd[:n], out, rows, cols, config=("mvh", r, ch))
                check(out.get(), ref[:n], scale16[:n])
