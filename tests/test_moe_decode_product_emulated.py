"""`moe_decode_product` (kernels/moe_products.py, decode's MoE expert product)
run on the host through tests/cuda_c_emulator.py against float64 products of gguf-py's dequantize.

It checks the pairs launch contract (block b = token-slot b, expert ids[b]; gate and up in
one launch by blockIdx.z; x_by_row for the down product; slot_of with an expert not resident and
blk_expert -1 leaving their rows untouched), row counts that are no multiple of the rows a lane group
or a CTA takes, rows whose chunks are no multiple of a pass (L * C), and rows of several passes.
Q4_K (16-byte loads), Q6_K (210-byte blocks, 4-aligned loads) and IQ4_XS (its levels in shared
memory, T::init after the block's early exits); shapes small, as CPU CI is slow (~17 s on 2 cores).
"""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from test_kernels_matvec_emulated import HOST_SHIMS

from lite.kernels import moe_products as mp
from lite.kernels import quant_info

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

TYPES = ("Q4_K", "Q6_K", "IQ4_XS")
E, K = 4, 2
PARAMS = ("const unsigned char* w0, const unsigned char* w1, long long ebytes, const int* slot_of, "
          "const float* x, float* out0, float* out1, const int* blk_expert, const int* blk_rows, "
          "int kdiv, int S, int rows, int cols, int x_by_row")
ARGS = "w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows, kdiv, S, rows, cols, x_by_row"
# (L, C, R) beside those config() picks for the shapes below: 3 passes of one chunk a lane (8, 1, 2),
# a pass of 64 chunk slots over a 24-chunk row (16, 4, 1), 32 lanes with 3 rows a group (32, 2, 3).
FORCED = ((8, 1, 2), (16, 4, 1), (32, 2, 3))
COLS = (512, 768)


def _configs(qtype):
    return sorted({mp.decode_shape(qtype, c) for c in COLS + (256,)} | set(FORCED))


def _kname(qtype, cfg):
    return f"emu_{qtype}_{'_'.join(map(str, cfg))}"


def _wrapper(qtype, cfg, act=0):
    # The emulator's grids are 2-D: y = 2 * block + z when a second matrix (w1) is given (not gated).
    L, C, R = cfg
    name = _kname(qtype, cfg) + (f"_a{act}" if act else "")
    return (f'extern "C" __global__ void {name}({PARAMS}) {{\n'
            + ("" if act else '    if (w1) { blockIdx.z = blockIdx.y & 1; blockIdx.y >>= 1; }\n')
            + f'    moe_decode_product<{mp.struct(qtype)}, {L}, {C}, {R}, {act}>({ARGS});\n}}\n')


@pytest.fixture(scope="module", params=TYPES)
def lib(request):
    qtype = request.param
    gated = {mp.gated_shape(qtype, c) for c in COLS}
    src = (HOST_SHIMS + mp.decode_source(qtype, host=True) + "".join(_wrapper(qtype, c) for c in _configs(qtype))
           + "".join(_wrapper(qtype, c, a) for c in gated for a in (1, 2)))
    return qtype, emu.compile_kernels(src)


def _experts(qtype, rows, cols, rng, n=E):
    info = quant_info(qtype)
    blocks = random_blocks(qtype, n * rows * cols // info.block_elems, rng)
    return blocks, reference(blocks, qtype).astype(np.float64).reshape(n, rows, cols)


def _x(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., ::7] *= 100.0
    return x


def _launch(lib, cfg, w0, w1, x, out0, out1, blk_expert, S, rows, cols, x_by_row=False, slot_of=None, n_slots=E):
    qtype, kern = lib
    L, _, R = cfg
    per_cta = mp.THREADS // L * R
    grid_y = blk_expert.size * (2 if w1 is not None else 1)
    kern.launch(_kname(qtype, cfg), (-(-rows // per_cta), grid_y), (mp.THREADS,),
                w0, w1, np.int64(w0.size // n_slots), slot_of, x, out0, out1, blk_expert, None, np.int32(K),
                np.int32(S), np.int32(rows), np.int32(cols), np.int32(bool(x_by_row)))


def _close(got, x, w):
    want = x.astype(np.float64) @ w.T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= 1e-3 * np.abs(want) + 1e-5 * scale + 1e-30), np.max(err / (np.abs(want) + 1e-30))


def test_config_fits_the_30b_a3b_shapes():
    """Gate/up rows (2048 inputs, 64 chunks): 16 lanes x 4 chunks, one pass; down (768, 24 chunks):
    8 lanes x 3 chunks; 2 rows a group, 16 and 32 rows a CTA (the sorted product: 2)."""
    assert mp.decode_shape("Q4_K", 2048) == (16, 4, 2) and mp.decode_rows_per_cta("Q4_K", 2048) == 16
    assert mp.decode_shape("Q4_K", 768) == (8, 3, 2) and mp.decode_rows_per_cta("Q4_K", 768) == 32
    assert mp.decode_name("Q6_K", 768) == "moe_decode_product<TQ6_K, 8, 3, 1>"       # the float struct
    assert mp.decode_name("Q6_K", 768, int8=True) == "moe_decode_product<TQ6_KQ, 8, 3, 1>"   # over int8 x
    for q in mp.TYPES:                         # every product type has a budget; R * C within it
        for cols in (256, 512, 768, 2048, 4096, 14336):
            L, C, R = mp.decode_shape(q, cols)
            assert L in (8, 16, 32) and 1 <= C <= 4 and 1 <= R <= 4 and (R * C <= 8)


@pytest.mark.parametrize("cols", COLS)
def test_pairs_gate_up_and_down_match_float64(lib, cols):
    """Decode: T = 3 tokens, k = 2; gate and up in one launch, then down with x_by_row; 37 rows
    (no multiple of 2, 3, 4 rows a group or of any CTA's rows). Every config the kernel is built in."""
    qtype = lib[0]
    rng = np.random.default_rng(cols)
    rows, T = 37, 3
    S = T * K
    (bg, Wg), (bu, Wu) = _experts(qtype, rows, cols, rng), _experts(qtype, rows, cols, rng)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32).reshape(-1)
    x, a = _x((T, cols), rng), _x((S, cols), rng)
    for cfg in [mp.decode_shape(qtype, cols)] + list(FORCED):
        g, u, y = (np.full((S, rows), np.nan, np.float32) for _ in range(3))
        _launch(lib, cfg, bg, bu, x, g, u, ids, S, rows, cols)
        _launch(lib, cfg, bg, None, a, y, None, ids, S, rows, cols, x_by_row=True)
        for i in range(S):
            e, t = ids[i], i // K
            _close(g[i], x[t], Wg[e])
            _close(u[i], x[t], Wu[e])
            _close(y[i], a[i], Wg[e])            # row i reads x row i, not its token's


def test_slots_and_unused_blocks_leave_rows_untouched(lib):
    """slot_of maps experts to cache slots (expert 1 not resident this round); blk_expert -1 (an
    unused block) and the missing expert's blocks write nothing; rows fewer than a group's R."""
    qtype = lib[0]
    rng = np.random.default_rng(7)
    rows, cols, T = 3, 256, 2
    blocks, W = _experts(qtype, rows, cols, rng)
    eb = blocks.size // E
    slot_of = np.array([2, -1, 0, 1], np.int32)
    slots = np.zeros(3 * eb, np.uint8)
    for e, s in enumerate(slot_of):
        if s >= 0:
            slots[s * eb:(s + 1) * eb] = blocks[e * eb:(e + 1) * eb]
    ids = np.array([1, 3, 0, 2, -1], np.int32)     # S = 4 slots and an unused block
    x = _x((T, cols), rng)
    y = np.full((ids.size, rows), np.nan, np.float32)
    cfg = mp.decode_shape(qtype, cols)
    _launch(lib, cfg, slots, None, x, y, None, ids, 4, rows, cols, slot_of=slot_of, n_slots=3)
    for i, e in enumerate(ids):
        if e < 0 or slot_of[e] < 0:
            assert np.isnan(y[i]).all()
        else:
            _close(y[i], x[i // K], W[e])


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gated_form_is_the_activation_of_gate_and_up(lib, act):
    """The decode product's gated form (decode's default, BackendConfig.moe_gated): one launch
    writes act(gate x) * (up x) for each token-slot;
    against gate and up from the plain kernel with the same lanes a row (the same sums), activated
    in NumPy fp32; 37 units (no multiple of a group's or a CTA's)."""
    qtype, kern = lib
    rng = np.random.default_rng(3)
    cols, rows, T = 512, 37, 3
    S = T * K
    (bg, Wg), (bu, _) = _experts(qtype, rows, cols, rng), _experts(qtype, rows, cols, rng)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32).reshape(-1)
    x = (rng.standard_normal((T, cols)) * 2 / np.sqrt((Wg * Wg).sum(-1).max())).astype(np.float32)  # act bends
    cfg = mp.gated_shape(qtype, cols)
    L, _, R = cfg
    assert R % 2 == 0 and mp.decode_name(qtype, cols, act).endswith(f", {mp.ACTS[act]}>")
    a = np.full((S, rows), np.nan, np.float32)
    kern.launch(_kname(qtype, cfg) + f"_a{mp.ACTS[act]}",
                (-(-rows // mp.decode_rows_per_cta(qtype, cols, act)), ids.size), (mp.THREADS,),
                bg, bu, np.int64(bg.size // E), None, x, a, None, ids, None, np.int32(K), np.int32(S),
                np.int32(rows), np.int32(cols), np.int32(0))
    g, u = (np.full((S, rows), np.nan, np.float32) for _ in range(2))
    plain = next(c for c in _configs(qtype) if c[0] == L)                 # the same lanes a row
    _launch(lib, plain, bg, bu, x, g, u, ids, S, rows, cols)
    want = (g / (np.float32(1) + np.exp(-g)) * u if act == "silu" else
            np.float32(0.5) * g * (np.float32(1) + np.tanh(np.float32(0.7978845608028654) * (
                g + np.float32(0.044715) * g * g * g))) * u)
    np.testing.assert_allclose(a, want, rtol=2e-6, atol=2e-6 * float(np.abs(want).max()))


def test_iq3_xxs_experts_match_float64():
    """IQ3_XXS experts (its grid read through L1, no shared copies): gate and up in one launch,
    for the shapes decode_shape() picks and one of 4 rows a group, against float64."""
    qtype = "IQ3_XXS"
    cfgs = sorted({mp.decode_shape(qtype, c) for c in COLS} | {(16, 2, 4)})
    body = "".join(_wrapper(qtype, c) for c in cfgs)
    lib = (qtype, emu.compile_kernels(HOST_SHIMS + mp.decode_source(qtype, host=True) + body))
    rng = np.random.default_rng(5)
    rows, T, cols = 21, 2, 512
    S = T * K
    (bg, Wg), (bu, Wu) = _experts(qtype, rows, cols, rng), _experts(qtype, rows, cols, rng)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32).reshape(-1)
    x = _x((T, cols), rng)
    for cfg in cfgs:
        g, u = (np.full((S, rows), np.nan, np.float32) for _ in range(2))
        _launch(lib, cfg, bg, bu, x, g, u, ids, S, rows, cols)
        for s in range(S):
            _close(g[s:s + 1], x[s // K:s // K + 1], Wg[ids[s]])
            _close(u[s:s + 1], x[s // K:s // K + 1], Wu[ids[s]])
