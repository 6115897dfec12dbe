"""The one-pass prefill attention kernel itself (kernels/cuda/flash_attention.cu through its real
wrapper, kernels/flash_attention.py) compiled with g++ against tests/cuda_c_emulator.py, its PTX
(mma.sync m16n8k16, ldmatrix .x4 / .trans, cp.async) emulated from the warp's fragments
(kernels/cuda/flash_attention_ptx.cuh), against a float64 attention: every head dim it takes, Q in
registers (64, 128) and in shared memory (256). On the GPU: tests/test_flash_attn.py. Skips
without g++."""
import numpy as np
import pytest

from cuda_c_emulator import available, emulated_kernels
from test_flash_attn import make_inputs, reference

pytestmark = pytest.mark.skipif(not available(), reason="needs g++ (C++20) to emulate CUDA C")


@pytest.fixture(scope="module")
def fa():
    with emulated_kernels("flash_attention", ascontiguousarray=np.ascontiguousarray) as mods:
        yield mods["flash_attention"]


def bound(V):
    """P is rounded to fp16 before P V (2^-11 relative an element, the row sum l taken before the
    rounding), so an output moves by at most about 2^-11 max|V|; twice that for the fp32 sums."""
    return 2.0 ** -10 * float(np.abs(V[np.isfinite(V)]).max())


def run(fa, D, T, H, Hkv, pos0, window, bm=None, seed=5):
    q, K, V = make_inputs(D, T, H, Hkv, pos0, seed=seed)
    scale = 1 / np.sqrt(D)
    got = fa.flash_prefill(q, K, V, pos0, window, scale, None, bm=bm)
    assert got.shape == (T, H, D) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference(q, K, V, pos0, window, scale), rtol=0, atol=bound(V))


# (D, T, H, Hkv, pos0, window): GQA after a cached prefix with rows past a tile's end; a window
# that starts inside the prefix; at D = 256 the chunk spans several 32-key tiles
@pytest.mark.parametrize("case", [
    (256, 40, 4, 2, 50, 0),
    (256, 20, 2, 1, 37, 24),
    (128, 24, 2, 1, 70, 0),
    (64, 24, 4, 2, 30, 40),
], ids=lambda c: "D{}-T{}-H{}/{}-pos{}-win{}".format(*c))
def test_kernel_matches_float64(fa, case):
    run(fa, *case)


def test_d256_with_128_rows_a_cta(fa):
    """The 8-warp CTA (bm=128): Q's shared tile and the K/V loads split over twice the threads."""
    run(fa, 256, 30, 2, 1, 9, 0, bm=128)


def test_d256_window_inside_the_chunk(fa):
    """A window narrower than the chunk: whole tiles before a row's window skipped or masked, the
    first rows (no prefix) seeing only themselves and the few keys before."""
    run(fa, 256, 48, 2, 2, 0, 10, seed=8)


def test_tiles_fit_the_device():
    """D = 256's default tile fits the smallest opt-in shared memory of sm_80+ parts (sm_86/89's
    99 KiB), and two of them an H100/H200 SM's 228 KiB."""
    from lite.kernels import flash_attention as fa
    assert fa.smem_bytes(256) <= 99 * 1024 and 2 * (fa.smem_bytes(256) + 1024) <= 228 * 1024
    assert fa.supported(256, 256) and not fa.supported(256, 128) and not fa.supported(96, 96)
