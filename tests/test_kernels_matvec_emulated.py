"""The CUDA C decode matvec kernels (kernels/matvec_cuda.py `mv`, kernels/matvec_iq.py `mvp`,
kernels/matvec_iq.py IQ3_XXS) run on the host through tests/cuda_c_emulator.py, against float64.

The Numba twins are what the simulator checks in CI; these tests check the CUDA C text itself
(the per-type decode structs and both kernel loops), which otherwise runs only on a GPU.

Also kernels/bench.py's copy16 (the copy-bandwidth reference of `lite bench kernels`, session 7) on
the host through the emulator: every 16-byte element copied, whatever the count against the grid's
stride (the unrolled part and the tail); and how many launches a timed graph holds.

HOST_SHIMS (below) is imported by the other emulated kernel tests.
"""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference

from lite.kernels import bench, dequant_iq, matvec_cuda, matvec_iq, quant_info

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

# Host stand-ins for the CUDA intrinsics the kernels use (the emulator has the rest).
HOST_SHIMS = r"""
#define LITE_HOST_SHIM
inline float lt_h2f(unsigned short h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
inline float h2f(unsigned short h) { return lt_h2f(h); }
inline unsigned short f2h(float v) { _Float16 f = (_Float16)v; unsigned short h; std::memcpy(&h, &f, 2); return h; }
inline unsigned __popc(unsigned v) { return __builtin_popcount(v); }
inline unsigned ksign(unsigned s7) { return s7 | ((__popc(s7) & 1u) << 7); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {   // selectors here never set bit 3
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
    return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (s & 31)); }
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (s < 32 ? s : 32)); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
"""


# --- the decode matvec kernels against float64 ---

TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
# 37 rows (no multiple of any rows a CTA); odd block counts for the 2-aligned types, so that rows
# start 2 bytes off a word and the loaders' funnel shifts are exercised.
SHAPES = {"Q4_0": (37, 32 * 33), "Q8_0": (37, 32 * 35), "Q4_K": (37, 768), "Q5_K": (37, 768),
          "Q6_K": (37, 768), "IQ3_XXS": (37, 768)}
ARGS = "const unsigned char* w, const float* x, float* out, int rows, int cols"


def _wrap(name, call):
    return f'extern "C" __global__ void {name}({ARGS}) {{ {call}(w, x, out, rows, cols); }}\n'


def _kernels():
    """(type, n, the kernel it calls, rows a CTA, persistent?, wrapper name) of every wrapper."""
    out = []
    for qt in TYPES:
        s = f"TQ{qt[1:]}"
        r, p = matvec_cuda.CONFIG[qt]
        for n in (1, 2):
            out.append((qt, n, f"matvec_rows<{s}, {n}, {r}, {p}>", r, False))
            out.append((qt, n, f"matvec_rows<{s}, {n}, 4, 1>", 4, False))
            out.append((qt, n, f"matvec_persistent<{s}, {n}, 4>", 4, True))
    out.append(("IQ3_XXS", 1, "matvec_persistent<TIQ3_XXS, 1, 8>", 8, True))
    for n in (1, 2):                                     # the two-instruction dot (mvf, Q4_K's default)
        out.append(("Q4_K", n, f"matvec_rows<TQ4_KH, {n}, 8, 0>", 8, False))
    return [(qt, n, call, r, persistent, f"emu_{i}") for i, (qt, n, call, r, persistent) in enumerate(out)]


@pytest.fixture(scope="module")
def lib():
    iq = matvec_iq   # its register kernels' macros (GCOPIES, GB, SX) and the IQ3_XXS struct
    source = (HOST_SHIMS + dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS")
              + matvec_cuda.C_HEAD + matvec_cuda.C_TYPES + matvec_cuda.C_KERNEL + matvec_iq.C_PERSISTENT
              + iq.C_COMMON + iq.C_IQ3_XXS + iq.C_IQ3_XXS_STAGED
              + "".join(_wrap(name, call) for _, _, call, _, _, name in _kernels()))
    return emu.compile_kernels(source)


def _problem(qt, n, seed):
    rows, cols = SHAPES[qt]
    rng = np.random.default_rng(seed)
    info = quant_info(qt)
    blocks = random_blocks(qt, rows * cols // info.block_elems, rng)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::7] *= 100.0
    w = reference(blocks, qt).astype(np.float64).reshape(rows, cols)
    return blocks, x, x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ np.abs(w).T


@pytest.mark.parametrize("kernel", _kernels(), ids=lambda k: f"{k[0]}-n{k[1]}-{k[2]}")
def test_emulated_cuda_c_matvec_matches_float64(lib, kernel):
    qt, n, _, rows_per_cta, persistent, name = kernel
    blocks, x, ref, scale = _problem(qt, n, seed=len(name) + 7 * n)
    rows, cols = SHAPES[qt]
    out = np.full((n, rows), np.nan, np.float32)
    groups = -(-rows // rows_per_cta)
    # the persistent kernel on fewer CTAs than row groups, so that a CTA walks several of them
    grid = 3 if persistent else groups
    lib.launch(name, (grid,), (128,), blocks, x, out, np.int32(rows), np.int32(cols))
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= 1e-3 * np.abs(ref) + 1e-5 * scale), np.max(err / (np.abs(ref) + 1e-30))


# --- kernels/bench.py: copy16 and the launches a timed graph holds ---

@pytest.mark.parametrize("n16", [1, 255, 256 * 2 * 4, 256 * 2 * 4 + 17, 5000])
def test_copy16_copies_every_element(n16):
    lib = emu.compile_kernels(HOST_SHIMS + bench.C_COPY16)
    src = np.random.default_rng(n16).integers(0, 2**32, 4 * n16, dtype=np.uint64).astype(np.uint32)
    dst = np.zeros_like(src)
    lib.launch("copy16", (2,), (256,), src, dst, np.int64(n16))
    np.testing.assert_array_equal(dst, src)


def test_graphs_hold_milliseconds_of_launches():
    """A timed graph runs for several milliseconds at the device's bandwidth (MAX_LAUNCHES of a 22.5 MB
    matrix product, 4096x14336 IQ3_XXS: session 13 found 11 there, ~0.4 us of graph overhead on each),
    never fewer than 10 launches."""
    assert bench._launches_for(22_478_848) == bench.MAX_LAUNCHES
    for nbytes in (150 << 20, 1 << 30, 8 << 30):
        n = bench._launches_for(nbytes)
        assert 10 <= n < bench.MAX_LAUNCHES
        assert n * nbytes / bench.DEVICE_BYTES_PER_S >= min(0.8 * bench.GRAPH_SECONDS, 10 * nbytes / bench.DEVICE_BYTES_PER_S)
