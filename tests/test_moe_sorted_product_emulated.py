"""The grouped MoE product over expert-sorted blocks of 8 token rows `moe_sorted_product` (short prefill) for
IQ3_XXS and IQ4_XS, its CUDA C run on the host through tests/cuda_c_emulator.py, against float64
products of gguf-py's dequantize. It checks the launch contract kernels/moe_products.grouped and
lite/backends/cuda_moe.py rely on: block b's expert from blk_expert (moe_align's blocks of 8),
slot_of (expert -> cache slot, -1 = not this round: rows left untouched), gate and up in one launch
(blockIdx.z), `x_by_row` for the down product, padding rows never written, row counts that are no
multiple of rows a CTA.
"""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from test_kernels_matvec_emulated import HOST_SHIMS

from lite.kernels import moe_layer as mk
from lite.kernels import moe_products as mp
from lite.kernels import quant_info

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

TYPES = mp.IQ_TYPES
E, K = 4, 2                         # experts, experts a token
PARAMS = ("const unsigned char* w0, const unsigned char* w1, long long ebytes, const int* slot_of, "
          "const float* x, float* out0, float* out1, const int* blk_expert, const int* blk_rows, "
          "int kdiv, int S, int rows, int cols, int x_by_row")
ARGS = "w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows, kdiv, S, rows, cols, x_by_row"


def _wrapper(qtype):
    # The emulator's grids are 2-D: y = 2 * block + z when a second matrix (w1) is given.
    return (f'extern "C" __global__ void emu_{qtype}({PARAMS}) {{\n'
            f'    if (w1) {{ blockIdx.z = blockIdx.y & 1; blockIdx.y >>= 1; }}\n'
            f'    {mp.sorted_name(qtype)}({ARGS});\n}}\n')


@pytest.fixture(scope="module", params=TYPES)
def lib(request):
    qtype = request.param
    src = HOST_SHIMS + mp.sorted_source(qtype, host=True) + _wrapper(qtype)
    return qtype, emu.compile_kernels(src)


def _experts(qtype, rows, cols, rng):
    """E experts (rows, cols) as one 3-D tensor's bytes, and their float64 values (gguf-py)."""
    info = quant_info(qtype)
    blocks = random_blocks(qtype, E * rows * cols // info.block_elems, rng)
    return blocks, reference(blocks, qtype).astype(np.float64).reshape(E, rows, cols)


def _ids(T, rng):
    return np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)


def _launch(lib, w0, w1, x, out0, out1, blk_expert, blk_rows, S, n_blocks, rows, cols, x_by_row=False,
            slot_of=None):
    qtype, kern = lib
    ebytes = w0.size // E if slot_of is None else w0.size // (max(slot_of) + 1)
    grid_y = n_blocks * (2 if w1 is not None else 1)
    kern.launch(f"emu_{qtype}", (-(-rows // mp.SORTED_ROWS), grid_y), (128,),
                w0, w1, np.int64(ebytes), slot_of, x, out0, out1, blk_expert, blk_rows, np.int32(K),
                np.int32(S), np.int32(rows), np.int32(cols), np.int32(bool(x_by_row)))


def _close(got, want, x, w):
    scale = np.abs(x) @ np.abs(w).T
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= 1e-3 * np.abs(want) + 1e-5 * scale + 1e-30), np.max(err / (np.abs(want) + 1e-30))


def _x(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., ::7] *= 100.0              # a few large inputs, as in the matvec tests
    return x


@pytest.mark.parametrize("T", [3, 12])
def test_sorted_blocks_of_eight_match_float64(lib, T):
    """Short prefill (N=8): moe_align's blocks (align_ref is its twin); padding rows not written."""
    qtype = lib[0]
    rng = np.random.default_rng(200 + T)
    rows, cols = 19, 256
    (bg, Wg), (bu, Wu) = _experts(qtype, rows, cols, rng), _experts(qtype, rows, cols, rng)
    ids = _ids(T, rng)
    al = mk.align_ref(ids, E, 8)
    nbm = al["blk_expert"].size
    P = nbm * 8
    x = _x((T, cols), rng)
    g, u = np.full((P, rows), np.nan, np.float32), np.full((P, rows), np.nan, np.float32)
    _launch(lib, bg, bu, x, g, u, al["blk_expert"], al["blk_rows"], T * K, nbm, rows, cols)
    a = _x((P, cols), rng)
    y = np.full((P, rows), np.nan, np.float32)
    _launch(lib, bg, None, a, y, None, al["blk_expert"], al["blk_rows"], T * K, nbm, rows, cols,
            x_by_row=True)
    for p, t in enumerate(al["blk_rows"]):
        if t < 0:
            assert np.isnan(g[p]).all() and np.isnan(u[p]).all() and np.isnan(y[p]).all()
            continue
        e = al["blk_expert"][p // 8]
        _close(g[p], x[t].astype(np.float64) @ Wg[e].T, x[t], Wg[e])
        _close(u[p], x[t].astype(np.float64) @ Wu[e].T, x[t], Wu[e])
        _close(y[p], a[p].astype(np.float64) @ Wg[e].T, a[p], Wg[e])


def test_sorted_blocks_from_slots_skip_the_experts_not_resident(lib):
    """slot_of: experts come from cache slots; experts not resident this round leave their rows."""
    qtype = lib[0]
    rng = np.random.default_rng(5)
    rows, cols, T = 21, 256, 6
    blocks, W = _experts(qtype, rows, cols, rng)
    eb = blocks.size // E
    slot_of = np.array([2, -1, 0, 1], np.int32)              # expert 1 is not in this round
    slots = np.zeros(3 * eb, np.uint8)
    for e, s in enumerate(slot_of):
        if s >= 0:
            slots[s * eb:(s + 1) * eb] = blocks[e * eb:(e + 1) * eb]
    ids = _ids(T, rng)
    al = mk.align_ref(ids, E, 8)
    nbm = al["blk_expert"].size
    x = _x((T, cols), rng)
    y = np.full((nbm * 8, rows), np.nan, np.float32)
    _launch(lib, slots, None, x, y, None, al["blk_expert"], al["blk_rows"], T * K, nbm, rows, cols,
            slot_of=slot_of)
    for p, t in enumerate(al["blk_rows"]):
        e = al["blk_expert"][p // 8]
        if t < 0 or slot_of[e] < 0:
            assert np.isnan(y[p]).all()
        else:
            _close(y[p], x[t].astype(np.float64) @ W[e].T, x[t], W[e])
