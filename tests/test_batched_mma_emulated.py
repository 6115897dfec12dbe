"""kernels/batched_mma.py (batched products on the int8 tensor cores, 9 to 256 rows of x): its CUDA C on the host
through tests/cuda_c_emulator.py (the mma fragments emulated lane by lane), against float64 products of gguf-py's
dequantize. Bound: W times quantized x is within fp32 rounding of the product (1e-5 of |x| @ |W|), and
quantized x within max |x| of its run of 32 / 64,516 of x (kernels/batched_mma.py's docstring), so
|out - x @ W.T| <= 1e-5 |x| @ |W| + |W| @ e. The GPU twin at full size: tests/test_batched_mma_gpu.py."""
import contextlib
import types

import numpy as np
import pytest

import cuda_c_emulator as emu
from cuda_c_emulator import HOST_SHIMS
from kernel_blocks import random_blocks, reference

from lite.kernels import batched_mma

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

SHIMS = r"""
inline int __float2int_rn(float v) { return (int)std::nearbyint(v); }   // default mode: to nearest even
"""
ARGS = ("const unsigned char* w, const signed char* hi, const signed char* lo, const float* d, const float* s, "
        "float* out, int n, int rows, int cols")
BLOCK = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q8_0": 32, "IQ4_XS": 256, "IQ3_XXS": 256}
FILE_TYPE = {"IQ3_XXS_G4": "IQ3_XXS", "IQ3_XXS_B16": "IQ3_XXS"}     # a GPU layout -> the file's type


@pytest.fixture(scope="module")
def lib():
    """The quantizer and batched_mma_product for every type and tile, as extern "C" kernels."""
    wraps = "".join(f'extern "C" __global__ void emu_{qt}_{nt}({ARGS}) '
                    f'{{ {batched_mma.kernel_name(qt, nt)}(w, hi, lo, d, s, out, n, rows, cols); }}\n'
                    for qt in batched_mma.TYPES for nt in batched_mma.TILES)
    wraps += ('extern "C" __global__ void emu_quantize(const float* x, signed char* hi, signed char* lo, float* d, '
              'float* s, int cols) { batched_quantize_x(x, hi, lo, d, s, cols); }\n')
    return emu.compile_kernels(HOST_SHIMS + SHIMS + batched_mma.c_source() + wraps)


def _x(n, cols, rng):
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::7] *= 100.0                        # a wide range inside a run
    x[:, 64:96] = 0.0                         # a run of zeros (d = 0)
    x[:, 5] = 1e-30                           # tiny beside its run
    return x


def _quantize(lib, x):
    n, cols = x.shape
    hi, lo = np.zeros((n, cols), np.int8), np.zeros((n, cols), np.int8)
    d, s = np.zeros((n, cols // 32), np.float32), np.zeros((n, cols // 32), np.float32)
    lib.launch("emu_quantize", batched_mma.grids(n, 1, cols)[0], (128,), x, hi, lo, d, s, np.int32(cols))
    return hi, lo, d, s


def quant_error(x):
    """e (n, cols): how far quantized x may be from x, max |x| of each run of 32 columns / 64,516."""
    n, cols = x.shape
    a = np.abs(x.astype(np.float64)).reshape(n, cols // 32, 32).max(axis=2)
    return np.repeat(a / 64516.0, 32, axis=1)


def test_quantized_x_parts_and_sums(lib):
    rng = np.random.default_rng(1)
    x = _x(3, 512, rng)
    hi, lo, d, s = _quantize(lib, x)
    hi64, lo64 = hi.astype(np.int64), lo.astype(np.int64)
    assert np.all(np.abs(hi64) <= 127) and np.all(np.abs(lo64) <= 127)
    a = np.abs(x.astype(np.float64)).reshape(3, -1, 32).max(axis=2)
    np.testing.assert_allclose(d, a / (127 * 254), rtol=1e-6)
    xhat = np.repeat(d.astype(np.float64), 32, axis=1) * (254 * hi64 + lo64)
    assert np.all(np.abs(xhat - x) <= quant_error(x) * (1 + 1e-4) + 1e-37)
    np.testing.assert_allclose(s, xhat.reshape(3, -1, 32).sum(axis=2), rtol=1e-6, atol=1e-37)
    assert d[0, 2] == 0 and not np.any(hi[:, 64:96]) and not np.any(lo[:, 64:96])   # the zero run


def weight(qt, rows, cols, rng):
    """(the bytes the product reads, the file's type, the file's blocks) of a random rows x cols weight of qt
    (a GPU layout: the file's blocks repacked as the backend does, kernels/gpu_layout.py)."""
    from lite.kernels import gpu_layout
    ft = FILE_TYPE.get(qt, qt)
    blocks = random_blocks(ft, rows * cols // BLOCK[ft], rng)
    return gpu_layout.repack(qt, blocks, rows, cols), ft, blocks


def run_product(lib, qt, blocks, x, rows, cols):
    n = x.shape[0]
    out = np.full((n, rows), np.nan, np.float32)
    hi, lo, d, s = _quantize(lib, x)
    lib.launch(f"emu_{qt}_{batched_mma.tile(n)}", batched_mma.grids(n, rows, cols)[1], (128,),
               blocks, hi, lo, d, s, out, np.int32(n), np.int32(rows), np.int32(cols))
    return out


def assert_within_bound(out, blocks, qt, x, rows, cols):
    w = reference(blocks, qt).astype(np.float64).reshape(rows, cols)
    ref, scale = x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ np.abs(w).T
    err = np.abs(out.astype(np.float64) - ref)
    bound = 1e-5 * scale + quant_error(x) @ np.abs(w).T
    assert np.all(np.isfinite(out)) and np.all(err <= bound), np.max(err - bound)


# rows: one CTA and a ragged second (IQ3_XXS_B16: whole bands, the second CTA's last 3 past the end); n: one
# tile of 16, two of 32 (the second partial), 64 (two full); the types added later on the first two
CASES = ([(qt, n) for qt in ("Q4_K", "Q6_K", "Q8_0") for n in (9, 16, 40, 64)]
         + [(qt, n) for qt in batched_mma.TYPES if qt not in ("Q4_K", "Q6_K", "Q8_0") for n in (9, 40)])


@pytest.mark.parametrize("qt,n", CASES)
def test_batched_product_within_bound_of_float64(lib, qt, n):
    rng = np.random.default_rng(n)
    rows, cols = 80, max(512, batched_mma.COLS.get(qt, 0))
    data, ft, blocks = weight(qt, rows, cols, rng)
    x = _x(n, cols, rng)
    assert_within_bound(run_product(lib, qt, data, x, rows, cols), blocks, ft, x, rows, cols)


def test_every_layout_of_iq3_xxs_the_backend_may_hold_is_covered(monkeypatch):
    """Whatever kernels/gpu_layout.py stores an IQ3_XXS matrix as, the batched product takes it."""
    from lite.kernels import gpu_layout, iq3_groups
    monkeypatch.setattr(iq3_groups, "SIMULATOR", False)      # (the layouts are the GPU's)
    seen = set()
    for layout in gpu_layout.IQ3_LAYOUTS:
        for shape, looked_up in [((4096, 4096), False), ((512, 2048), False), ((4096, 768), False),
                                 ((151936, 2048), True)]:
            held = gpu_layout.gpu_layout("IQ3_XXS", shape, ("IQ3_XXS",), layout, looked_up)
            assert batched_mma.applies(held, shape[1]), (layout, shape, held)
            seen.add(held)
    assert seen == {"IQ3_XXS", "IQ3_XXS_G4", "IQ3_XXS_B16"}


def test_the_bound_catches_a_wrong_scale(lib):
    """The check above fails a product that is off by one run's scale (so it would catch a misplaced one)."""
    rng = np.random.default_rng(5)
    rows, cols, qt = 64, 256, "Q4_K"
    blocks = random_blocks(qt, rows * cols // 256, rng)
    x = _x(9, cols, rng)
    wrong = blocks.reshape(rows, -1).copy()
    wrong[:, 4] ^= 1                          # sub-block 0's 6-bit scale, one bit off
    out = run_product(lib, qt, wrong.reshape(-1), x, rows, cols)
    with pytest.raises(AssertionError):
        assert_within_bound(out, blocks, qt, x, rows, cols)


def test_tiles_and_applies():
    assert [batched_mma.tile(n) for n in (9, 16, 17, 32, 33, 256)] == [16, 16, 32, 32, 32, 32]
    assert batched_mma.grids(256, 4096, 4096) == ((32, 256), (8, 64))
    assert batched_mma.applies("Q4_K", 4096) and not batched_mma.applies("Q4_K", 4000)
    assert not batched_mma.applies("IQ2_XXS", 4096)
    assert batched_mma.applies("IQ3_XXS_G4", 2048) and not batched_mma.applies("IQ3_XXS_G4", 768)


# --- the backend's choice and the graph rule (lite/backends/cuda_linear.py,
#     lite/engine/paged_cuda.py max_rows) ---

def _backend(qtypes, **config):
    """A CUDABackend without a device: its weights' types and shapes and a BackendConfig."""
    from lite.backend_config import BackendConfig
    from lite.backends.cuda import CUDABackend
    be = object.__new__(CUDABackend)
    be.config = BackendConfig(**config)
    be.w = {f"blk.0.w{i}.weight": types.SimpleNamespace(qtype=q, shape=(4096, 4096), data=np.zeros(1, np.uint8))
            for i, q in enumerate(qtypes)}
    be.w["output_norm.weight"] = types.SimpleNamespace(qtype="F32", shape=(4096,))
    be.fused = {}
    return be


def test_products_of_9_to_256_rows_take_it_with_the_switch():
    be, off = _backend(["Q4_K"], batched_mma=True), _backend(["Q4_K"])
    w = be.w["blk.0.w0.weight"]
    assert [be._batched(w, t) for t in (8, 9, 64, 256, 257)] == [False, True, True, True, False]
    assert not off._batched(w, 64)
    assert not be._batched(types.SimpleNamespace(qtype="IQ2_XXS", shape=(4096, 4096), data=w.data), 64)


def test_graphs_take_steps_up_to_256_rows_only_where_every_weight_is_covered():
    from lite.backends.cuda_linear import SPLIT_MAX_TOKENS
    from lite.engine.paged_cuda import DecodeGraphs, max_rows
    from lite.engine.stage import Stage, StageSpec
    cfg = types.SimpleNamespace(is_moe=False, is_recurrent_layer=lambda il: False)
    pools = [types.SimpleNamespace(block_size=16)]
    n = 64
    for be, rows in [(_backend(["Q4_K", "Q6_K", "Q8_0"]), SPLIT_MAX_TOKENS),        # off: cuBLAS past 32
                     (_backend(["Q4_K", "Q6_K", "Q8_0"], batched_mma=True), batched_mma.MAX_ROWS),
                     (_backend(["IQ3_XXS_B16", "IQ3_XXS_G4", "IQ4_XS", "Q5_K", "Q6_K"], batched_mma=True),
                      batched_mma.MAX_ROWS),                  # the IQ files' dense weights as the GPU holds them
                     (_backend(["Q4_K", "IQ2_XXS"], batched_mma=True), SPLIT_MAX_TOKENS)]:  # one not covered
        assert be.graph_rows() == rows
        st = object.__new__(Stage)
        st.spec, st.cfg, st.use_graphs, st.ops = StageSpec(range(0, 1), True, True), cfg, True, be
        assert max_rows(st, 512) == rows and max_rows(st, 16) == 16
        step = DecodeGraphs([st], pools, 256, 16).step(list(range(n)), [0] * n, [1] * n, [[i] for i in range(n)])
        assert (step is not None and step.size == n) == (rows >= n)


def test_graph_rows_counts_the_fused_groups():
    """An interleaved [gate; up] pair lives only as its fused weight (lite/backends/cuda_weights.py)."""
    from lite.backends.cuda_linear import SPLIT_MAX_TOKENS
    be = _backend(["Q4_K"], batched_mma=True)
    pair = ("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight")
    be.fused[pair] = (types.SimpleNamespace(qtype="IQ2_XXS", shape=(8192, 4096)), [4096, 4096], True)
    assert be.graph_rows() == SPLIT_MAX_TOKENS
    be.fused[pair] = (types.SimpleNamespace(qtype="IQ3_XXS_B16", shape=(8192, 4096)), [4096, 4096], True)
    assert be.graph_rows() == batched_mma.MAX_ROWS


# --- MoE stages (lite/backends/cuda_moe.py moe_graph_rows): the router's kernel and the sorted products ---

def test_moe_steps_graph_up_to_64_rows_with_the_experts_on_the_device():
    from lite.backends.cuda_linear import SPLIT_MAX_TOKENS
    from lite.backends.cuda_moe import FUSED_MAX_TOKENS
    from lite.engine.paged_cuda import max_rows
    from lite.engine.stage import Stage, StageSpec
    st = object.__new__(Stage)
    st.spec, st.use_graphs = StageSpec(range(0, 1), True, True), True
    st.cfg = types.SimpleNamespace(is_moe=True, is_recurrent_layer=lambda il: False)
    off_device = _backend(["Q4_K"], batched_mma=True)
    off_device.host_experts = object()            # experts off the device: the host reads their ids past decode
    for be, rows in [(_backend(["Q4_K"], batched_mma=True), 64),
                     (_backend(["Q4_K"]), FUSED_MAX_TOKENS),      # only with the switch
                     (_backend(["Q4_K", "IQ2_XXS"], batched_mma=True), SPLIT_MAX_TOKENS),   # 8-row matvecs
                     (off_device, FUSED_MAX_TOKENS)]:
        st.ops = be
        assert be.moe_graph_rows() == rows and max_rows(st, 256) == rows and max_rows(st, 4) == 4


def test_the_router_takes_its_kernel_up_to_64_rows(monkeypatch):
    """Its logits by moe_logits (capturable), not cuBLAS's h @ W.T, for every row count a graph may take:
    up to 64 rows with batched_mma, else decode's 8 (the default path stays as verified on the GPU)."""
    from lite.backends import cuda_moe
    calls = []
    monkeypatch.setattr(cuda_moe.mk, "logits", lambda h, w, out, pdl=False: calls.append(h.shape[0]))
    monkeypatch.setattr(cuda_moe.mk, "topk", lambda *a, **k: None)
    for on, want in [(True, [1, 8, 9, 64]), (False, [1, 8])]:
        calls.clear()
        be = _backend([], batched_mma=on)
        be.cp, be.stream, be.pdl = np, contextlib.nullcontext(), False
        be.w["r"] = types.SimpleNamespace(qtype="F32", shape=(8, 64), data=np.ones((8, 64), np.float32))
        for T in (1, 8, 9, 64, 65):
            be.moe_route(np.ones((T, 64), np.float32), "r", 2, True)
        assert calls == want
