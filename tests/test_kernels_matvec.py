"""The decode products: the fused dequantize-and-dot kernels (kernels/matvec_basic.py), the warp sums
(kernels/util.py), and their CUDA C (kernels/matvec_cuda.py's matvec_rows, kernels/matvec_iq.py's
matvec_persistent and IQ3_XXS struct).

Under the simulator on tiny shapes against a float64 product of the gguf-py dequantization; on a GPU
also one matvec captured into a CUDA graph and replayed, and the CUDA C kernels against their Numba
twins at full size (skipped elsewhere). The CUDA C text itself (the per-type decode structs and both
kernel loops) also runs on the host through tests/cuda_c_emulator.py against float64 (needs g++; runs
in CI, where the GPU tests skip).

Also kernels/bench.py's copy16 (the copy-bandwidth reference of `lite bench kernels`) on the host
through the emulator: every 16-byte element copied, whatever the count against the grid's stride (the
unrolled part and the tail); and how many launches a timed graph holds.
"""
import numpy as np
import pytest

import cuda_c_emulator as emu
from conftest import HAS_GPU
from cuda_c_emulator import HOST_SHIMS
from kernel_blocks import random_blocks, reference

from lite.kernels import bench, dequant_iq, matvec, matvec_cuda, matvec_iq, matvec_types, quant_info
from numba import cuda  # after lite.kernels: the simulator's numba.cuda is swapped in for kernels
from lite.kernels.util import SIMULATOR, group_sum, warp_sum

needs_gxx = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]      # with a CUDA C twin
NUMBA_ONLY = ["Q4_1", "Q5_0", "Q5_1"]                   # Numba kernels on the GPU as well
ALL_TYPES = TYPES + NUMBA_ONLY

# Block counts per row are odd on purpose for the types whose blocks are not a multiple of 4 bytes:
# rows then start at byte offsets that are not 4-aligned, and the total is not a whole number of words.
SHAPES = {"Q4_0": (6, 224), "Q8_0": (5, 96), "Q4_K": (6, 512), "Q5_K": (5, 512), "Q6_K": (5, 768),
          "Q4_1": (6, 224), "Q5_0": (5, 160), "Q5_1": (7, 96)}


def _xp():
    if SIMULATOR:
        return np
    import cupy
    return cupy


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _problem(qtype, rows, cols, n, seed):
    rng = np.random.default_rng(seed)
    info = quant_info(qtype)
    blocks = random_blocks(qtype, rows * cols // info.block_elems, rng)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::7] *= 100.0            # a few large activations, as real hidden states have
    w = reference(blocks, qtype).astype(np.float64).reshape(rows, cols)
    ref = x.astype(np.float64) @ w.T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T
    return blocks, x, ref, scale


def _check(out, ref, scale):
    out = _host(out).astype(np.float64)
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out))
    # 1e-3 relative to each result, with a floor far below it where a result cancels to ~0
    # (fp32 accumulation error grows with sum |x_i w_i|, not with the result itself).
    err = np.abs(out - ref)
    assert np.all(err <= 1e-3 * np.abs(ref) + 1e-5 * scale), np.max(err / (np.abs(ref) + 1e-30))


def test_all_basic_types_registered():
    assert set(ALL_TYPES) <= set(matvec_types())


@pytest.mark.parametrize("qtype", ALL_TYPES)
@pytest.mark.parametrize("n", [1, 3])
def test_matvec_matches_float64_reference(qtype, n):
    rows, cols = SHAPES[qtype]
    blocks, x, ref, scale = _problem(qtype, rows, cols, n, seed=10 * ALL_TYPES.index(qtype) + n)
    xp = _xp()
    out = matvec(xp.asarray(blocks), qtype, xp.asarray(x), rows, cols)
    _check(out, ref, scale)


def test_more_x_rows_than_one_launch_takes():
    # n = 9 runs as chunks of 8 and 1; each chunk must land in its own rows of out.
    rows, cols = 4, 256
    blocks, x, ref, scale = _problem("Q4_K", rows, cols, 9, seed=7)
    xp = _xp()
    out = matvec(xp.asarray(blocks), "Q4_K", xp.asarray(x), rows, cols)
    _check(out, ref, scale)


def test_one_dimensional_x_and_unaligned_blocks():
    # Blocks that start 2 bytes into a buffer (a byte slice of a larger tensor) are realigned.
    rows, cols = 3, 64
    blocks, x, ref, scale = _problem("Q8_0", rows, cols, 1, seed=3)
    xp = _xp()
    buf = xp.zeros(blocks.size + 2, dtype=np.uint8)
    buf[2:] = xp.asarray(blocks)
    out = matvec(buf[2:], "Q8_0", xp.asarray(x[0]), rows, cols)
    assert out.shape == (rows,)
    _check(out[None, :], ref, scale)


def test_scale_edge_cases_exact():
    # Every f16 scale category (normal +-, subnormal, +-0) decoded exactly: with x a one-hot
    # vector the product is a single weight, which must equal gguf-py's value exactly.
    rows, cols = 4, 64
    rng = np.random.default_rng(11)
    blocks = random_blocks("Q4_0", rows * cols // 32, rng)
    w = reference(blocks, "Q4_0").reshape(rows, cols)
    xp = _xp()
    x = np.zeros((2, cols), np.float32)
    x[0, 5] = 1.0
    x[1, 40] = 1.0
    out = _host(matvec(xp.asarray(blocks), "Q4_0", xp.asarray(x), rows, cols))
    np.testing.assert_array_equal(out, np.stack([w[:, 5], w[:, 40]]))


def test_bad_inputs_raise():
    rows, cols = 2, 256
    blocks, x, _, _ = _problem("Q6_K", rows, cols, 1, seed=1)
    xp = _xp()
    b = xp.asarray(blocks)
    with pytest.raises(ValueError):
        matvec(b, "Q6_K", xp.asarray(x[:, :128]), rows, cols)
    with pytest.raises(ValueError):
        matvec(b, "Q6_K", xp.asarray(x.astype(np.float64)), rows, cols)
    with pytest.raises(ValueError):
        matvec(b[:-1], "Q6_K", xp.asarray(x), rows, cols)


def test_warp_sums():

    @cuda.jit
    def k(a, o32, o16, o4):
        t = cuda.threadIdx.x
        o32[t] = warp_sum(a[t])
        o16[t] = group_sum(a[t], 16)
        o4[t] = group_sum(a[t], 4)

    rng = np.random.default_rng(0)
    a = rng.standard_normal(64).astype(np.float32)
    xp = _xp()
    outs = [xp.zeros(64, np.float32) for _ in range(3)]
    k[1, 64](xp.asarray(a), *outs)
    for o, width in zip(outs, (32, 16, 4)):
        want = np.repeat(a.astype(np.float64).reshape(-1, width).sum(1), width)
        np.testing.assert_allclose(_host(o), want, rtol=1e-5, atol=1e-5)
        # every lane of a group holds the very same value
        assert np.all(_host(o).reshape(-1, width) == _host(o).reshape(-1, width)[:, :1])


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU: CUDA graphs do not exist under the simulator")
def test_matvec_in_cuda_graph_replays_like_direct_launch():
    import cupy
    rows, cols = 256, 1024
    blocks, x, ref, scale = _problem("Q4_K", rows, cols, 2, seed=5)
    b, xd = cupy.asarray(blocks), cupy.asarray(x)
    direct = matvec(b, "Q4_K", xd, rows, cols)
    stream = cupy.cuda.Stream(non_blocking=True)
    out = cupy.zeros((2, rows), np.float32)
    with stream:
        matvec(b, "Q4_K", xd, rows, cols, stream=stream, out=out)   # compile outside capture
        out.fill(0)
        stream.begin_capture()
        matvec(b, "Q4_K", xd, rows, cols, stream=stream, out=out)
        graph = stream.end_capture()
        out.fill(0)
        graph.launch(stream)
    stream.synchronize()
    _check(out, ref, scale)
    np.testing.assert_array_equal(out.get(), direct.get())


# ---- the CUDA C path (kernels/matvec_cuda.py), GPU only ------------------------------------------
# Full-size shapes of an 8B model's FFN (both orientations), and a ragged one (also the emulated
# tests' shape): 37 rows, no multiple of any CTA's rows; odd block counts for the 2-aligned types
# (Q4_0, Q8_0, Q6_K), so that rows start 2 bytes off a word and the loaders' funnel shifts run.
FULL = {"Q4_K": (4096, 14336), "Q6_K": (4096, 14336), "Q4_0": (14336, 4096), "Q8_0": (14336, 4096),
        "Q5_K": (14336, 4096)}
RAGGED = {"Q4_0": (37, 32 * 33), "Q8_0": (37, 32 * 35), "Q4_K": (37, 768), "Q5_K": (37, 768), "Q6_K": (37, 768),
          "IQ3_XXS": (37, 768)}


def _both_impls(monkeypatch, qtype, blocks, x, rows, cols, config=None):
    """(CUDA C result, Numba result), asserting that the CUDA C kernel really ran for the first.
    config: a (rows per CTA, prefetch) to use instead of matvec_cuda.CONFIG's."""
    import cupy
    calls = []
    real = getattr(matvec_cuda.launch, "real", matvec_cuda.launch)   # not a spy of an earlier call

    def spy(*a, **k):
        calls.append(a[0])
        return real(*a, **k, cta=config)

    spy.real = real

    monkeypatch.setattr(matvec_cuda, "launch", spy)
    b, xd = cupy.asarray(blocks), cupy.asarray(x)
    out = {}
    for impl in ("cuda", "numba"):      # the float CUDA C kernel (not the integer-dot one) against its Numba twin
        out[impl] = matvec(b, qtype, xd, rows, cols, int8_dot_types=(), reference=impl == "numba").get()
    assert calls == [qtype], "the CUDA C kernel was not used on aligned inputs"
    return out["cuda"], out["numba"]


@pytest.mark.skipif(SIMULATOR, reason="the CUDA C kernels run only on a GPU (no GPU driver here)")
@pytest.mark.parametrize("qtype", TYPES)
def test_cuda_c_matches_numba_and_float64_full_size(qtype, monkeypatch):
    rows, cols = FULL[qtype]
    blocks, x, ref, scale = _problem(qtype, rows, cols, 1, seed=20 + TYPES.index(qtype))
    got, twin = _both_impls(monkeypatch, qtype, blocks, x, rows, cols)
    _check(got, ref, scale)
    _check(twin, ref, scale)
    # the two fp32 sums differ only in order: far below the 1e-3 bar
    assert np.all(np.abs(got - twin) <= 1e-6 * scale + 1e-4 * np.abs(ref))


@pytest.mark.skipif(SIMULATOR, reason="the CUDA C kernels run only on a GPU (no GPU driver here)")
@pytest.mark.parametrize("qtype", TYPES)
def test_cuda_c_ragged_rows_and_every_n(qtype, monkeypatch):
    # n = 9 is one launch of 8 plus one of 1; both loop shapes (with and without prefetch)
    # (rows of 594-1190 bytes: not 16-aligned for Q4_0/Q8_0/Q6_K, so the register kernel runs)
    rows, cols = RAGGED[qtype]
    blocks, x, ref, scale = _problem(qtype, rows, cols, 9, seed=40 + TYPES.index(qtype))
    for config in (None, (4, 1), (8, 0)):
        for n in (1, 2, 3, 9):
            got, twin = _both_impls(monkeypatch, qtype, blocks, x[:n], rows, cols, config)
            _check(got, ref[:n], scale[:n])
            _check(twin, ref[:n], scale[:n])


@pytest.mark.skipif(SIMULATOR, reason="the CUDA C kernels run only on a GPU (no GPU driver here)")
def test_cuda_c_skipped_for_unaligned_blocks(monkeypatch):
    # Blocks 2 bytes into a buffer do not qualify for 16-byte loads: the Numba path must take them.
    import cupy
    rows, cols = 8, 512
    blocks, x, ref, scale = _problem("Q4_K", rows, cols, 1, seed=9)
    buf = cupy.zeros(blocks.size + 2, dtype=np.uint8)
    buf[2:] = cupy.asarray(blocks)
    assert not matvec_cuda.qualifies("Q4_K", buf[2:], cupy.asarray(x))
    _check(matvec(buf[2:], "Q4_K", cupy.asarray(x), rows, cols), ref, scale)


def test_launch_plan():
    # pure host logic (no GPU): which kernel and configuration one launch gets
    plan, name = matvec_cuda.plan, matvec_cuda.kernel_name
    assert plan("Q4_K", 1) == (True, 8, 0) and plan("Q4_K", 2) == (True, 8, 0)   # the two-instruction dot
    assert plan("Q4_K", 3) == (False, 4, 0)                                      # n > 2: at most 4 rows
    assert plan("Q8_0", 1) == (False, 8, 1) and plan("Q8_0", 5) == (False, 4, 1)
    assert plan("Q6_K", 1) == (False,) + matvec_cuda.CONFIG["Q6_K"]
    assert name("Q4_K", 2, False, 8, 0) == "matvec_rows<TQ4_K, 2, 8, 0>"
    assert name("Q4_K", 1, True, 8, 0) == "matvec_rows<TQ4_KH, 1, 8, 0>"


# ---- the CUDA C kernels on the host (tests/cuda_c_emulator.py) ------------------------------------

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
    out.append(("IQ3_XXS", 1, "matvec_persistent<Iq3XxsBlock, 1, 8>", 8, True))
    for n in (1, 2):                                     # the two-instruction dot (Q4_K's default)
        out.append(("Q4_K", n, f"matvec_rows<TQ4_KH, {n}, 8, 0>", 8, False))
    return [(qt, n, call, r, persistent, f"emu_{i}") for i, (qt, n, call, r, persistent) in enumerate(out)]


@pytest.fixture(scope="module")
def emulated():
    # matvec_iq: its register kernels' macros (GCOPIES, GB, SX) and the IQ3_XXS struct
    source = (HOST_SHIMS + dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS")
              + matvec_cuda.C_HEAD + matvec_cuda.C_TYPES + matvec_cuda.C_KERNEL + matvec_iq.C_PERSISTENT
              + matvec_iq.C_COMMON + matvec_iq.C_IQ3_XXS + matvec_iq.C_IQ3_XXS_STAGED
              + "".join(_wrap(name, call) for _, _, call, _, _, name in _kernels()))
    return emu.compile_kernels(source)


@needs_gxx
@pytest.mark.parametrize("kernel", _kernels(), ids=lambda k: f"{k[0]}-n{k[1]}-{k[2]}")
def test_emulated_cuda_c_matvec_matches_float64(emulated, kernel):
    qt, n, _, rows_per_cta, persistent, name = kernel
    rows, cols = RAGGED[qt]
    blocks, x, ref, scale = _problem(qt, rows, cols, n, seed=len(name) + 7 * n)
    out = np.full((n, rows), np.nan, np.float32)
    groups = -(-rows // rows_per_cta)
    # the persistent kernel on fewer CTAs than row groups, so that a CTA walks several of them
    grid = 3 if persistent else groups
    emulated.launch(name, (grid,), (128,), blocks, x, out, np.int32(rows), np.int32(cols))
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= 1e-3 * np.abs(ref) + 1e-5 * scale), np.max(err / (np.abs(ref) + 1e-30))


# ---- kernels/bench.py: copy16 and the launches a timed graph holds --------------------------------

@needs_gxx
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
