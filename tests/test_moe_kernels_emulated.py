"""The MoE kernels' CUDA C run on the host through tests/cuda_c_emulator.py (g++; skipped without it).

`moe_decode_product` (kernels/moe_products.py, decode's MoE expert product) against float64
products of gguf-py's dequantize. It checks the pairs launch contract (block b = token-slot b,
expert ids[b]; gate and up in one launch by blockIdx.z; x_by_row for the down product; slot_of with
an expert not resident and blk_expert -1 leaving their rows untouched), row counts that are no
multiple of the rows a lane group or a CTA takes, rows whose chunks are no multiple of a pass
(L * C), and rows of several passes. Q4_K (16-byte loads), Q6_K (210-byte blocks, 4-aligned loads)
and IQ4_XS (its levels in shared memory, T::init after the block's early exits); shapes small, as
CPU CI is slow (~17 s on 2 cores).

The grouped MoE product over expert-sorted blocks of 8 token rows `moe_sorted_product` (short
prefill) for IQ3_XXS and IQ4_XS, against float64 products of gguf-py's dequantize. It checks the
launch contract kernels/moe_products.grouped and lite/backends/cuda_moe.py rely on: block b's
expert from blk_expert (moe_align's blocks of 8), slot_of (expert -> cache slot, -1 = not this
round: rows left untouched), gate and up in one launch (blockIdx.z), `x_by_row` for the down
product, padding rows never written, row counts that are no multiple of rows a CTA.

The router and the combine of kernels/cuda/moe_layer.cu: moe_logits then moe_topk give what
route_ref says, and moe_combine with res writes exactly res + (its output without res).

Each section has its own helpers (the sorted product's _sorted_*, the router's route_lib)."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from cuda_c_emulator import HOST_SHIMS

from lite.kernels import moe_layer as mk
from lite.kernels import moe_products as mp
from lite.kernels import quant_info
from lite.kernels.moe_layer import C_MOE

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")


# --- moe_decode_product: decode's pairs launch ---

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


# --- moe_sorted_product: short prefill's expert-sorted blocks of 8 rows ---

SORTED_TYPES = mp.IQ_TYPES
# E, K, PARAMS and ARGS: the decode product's above (the same values and parameter list)


def _sorted_wrapper(qtype):
    # The emulator's grids are 2-D: y = 2 * block + z when a second matrix (w1) is given.
    return (f'extern "C" __global__ void emu_{qtype}({PARAMS}) {{\n'
            f'    if (w1) {{ blockIdx.z = blockIdx.y & 1; blockIdx.y >>= 1; }}\n'
            f'    {mp.sorted_name(qtype)}({ARGS});\n}}\n')


@pytest.fixture(scope="module", params=SORTED_TYPES)
def sorted_lib(request):
    qtype = request.param
    src = HOST_SHIMS + mp.sorted_source(qtype, host=True) + _sorted_wrapper(qtype)
    return qtype, emu.compile_kernels(src)


def _sorted_experts(qtype, rows, cols, rng):
    """E experts (rows, cols) as one 3-D tensor's bytes, and their float64 values (gguf-py)."""
    info = quant_info(qtype)
    blocks = random_blocks(qtype, E * rows * cols // info.block_elems, rng)
    return blocks, reference(blocks, qtype).astype(np.float64).reshape(E, rows, cols)


def _sorted_ids(T, rng):
    return np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)


def _sorted_launch(sorted_lib, w0, w1, x, out0, out1, blk_expert, blk_rows, S, n_blocks, rows, cols,
                   x_by_row=False, slot_of=None):
    qtype, kern = sorted_lib
    ebytes = w0.size // E if slot_of is None else w0.size // (max(slot_of) + 1)
    grid_y = n_blocks * (2 if w1 is not None else 1)
    kern.launch(f"emu_{qtype}", (-(-rows // mp.SORTED_ROWS), grid_y), (128,),
                w0, w1, np.int64(ebytes), slot_of, x, out0, out1, blk_expert, blk_rows, np.int32(K),
                np.int32(S), np.int32(rows), np.int32(cols), np.int32(bool(x_by_row)))


def _sorted_close(got, want, x, w):
    scale = np.abs(x) @ np.abs(w).T
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= 1e-3 * np.abs(want) + 1e-5 * scale + 1e-30), np.max(err / (np.abs(want) + 1e-30))


def _sorted_x(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., ::7] *= 100.0              # a few large inputs, as in the matvec tests
    return x


@pytest.mark.parametrize("T", [3, 12])
def test_sorted_blocks_of_eight_match_float64(sorted_lib, T):
    """Short prefill (N=8): moe_align's blocks (align_ref is its twin); padding rows not written."""
    qtype = sorted_lib[0]
    rng = np.random.default_rng(200 + T)
    rows, cols = 19, 256
    (bg, Wg), (bu, Wu) = _sorted_experts(qtype, rows, cols, rng), _sorted_experts(qtype, rows, cols, rng)
    ids = _sorted_ids(T, rng)
    al = mk.align_ref(ids, E, 8)
    nbm = al["blk_expert"].size
    P = nbm * 8
    x = _sorted_x((T, cols), rng)
    g, u = np.full((P, rows), np.nan, np.float32), np.full((P, rows), np.nan, np.float32)
    _sorted_launch(sorted_lib, bg, bu, x, g, u, al["blk_expert"], al["blk_rows"], T * K, nbm, rows, cols)
    a = _sorted_x((P, cols), rng)
    y = np.full((P, rows), np.nan, np.float32)
    _sorted_launch(sorted_lib, bg, None, a, y, None, al["blk_expert"], al["blk_rows"], T * K, nbm, rows, cols,
                   x_by_row=True)
    for p, t in enumerate(al["blk_rows"]):
        if t < 0:
            assert np.isnan(g[p]).all() and np.isnan(u[p]).all() and np.isnan(y[p]).all()
            continue
        e = al["blk_expert"][p // 8]
        _sorted_close(g[p], x[t].astype(np.float64) @ Wg[e].T, x[t], Wg[e])
        _sorted_close(u[p], x[t].astype(np.float64) @ Wu[e].T, x[t], Wu[e])
        _sorted_close(y[p], a[p].astype(np.float64) @ Wg[e].T, a[p], Wg[e])


def test_sorted_blocks_from_slots_skip_the_experts_not_resident(sorted_lib):
    """slot_of: experts come from cache slots; experts not resident this round leave their rows."""
    qtype = sorted_lib[0]
    rng = np.random.default_rng(5)
    rows, cols, T = 21, 256, 6
    blocks, W = _sorted_experts(qtype, rows, cols, rng)
    eb = blocks.size // E
    slot_of = np.array([2, -1, 0, 1], np.int32)              # expert 1 is not in this round
    slots = np.zeros(3 * eb, np.uint8)
    for e, s in enumerate(slot_of):
        if s >= 0:
            slots[s * eb:(s + 1) * eb] = blocks[e * eb:(e + 1) * eb]
    ids = _sorted_ids(T, rng)
    al = mk.align_ref(ids, E, 8)
    nbm = al["blk_expert"].size
    x = _sorted_x((T, cols), rng)
    y = np.full((nbm * 8, rows), np.nan, np.float32)
    _sorted_launch(sorted_lib, slots, None, x, y, None, al["blk_expert"], al["blk_rows"], T * K, nbm, rows, cols,
                   slot_of=slot_of)
    for p, t in enumerate(al["blk_rows"]):
        e = al["blk_expert"][p // 8]
        if t < 0 or slot_of[e] < 0:
            assert np.isnan(y[p]).all()
        else:
            _sorted_close(y[p], x[t].astype(np.float64) @ W[e].T, x[t], W[e])


# --- the router (moe_logits, moe_topk) and moe_combine of kernels/cuda/moe_layer.cu ---

ROUTE_SHIMS = ("inline unsigned short moe_f2h(float f) { return f2h(f); }\n"
               "inline float __fmul_rn(float a, float b) { return a * b; }\n"
               "inline float __fadd_rn(float a, float b) { return a + b; }\n"
               # moe_align's (compiled with the rest of C_MOE, never launched here)
               "inline unsigned __match_any_sync(unsigned, int) { return 0; }\n")
ROUTE_WRAP = r"""
extern "C" __global__ void topk4(const float* l, int* ids, float* wts, int T, int n, int k, int nz) {
    moe_topk<4>(l, ids, wts, T, n, k, nz); }
"""


@pytest.fixture(scope="module")
def route_lib():
    return emu.compile_kernels(HOST_SHIMS + ROUTE_SHIMS + C_MOE + ROUTE_WRAP)


@pytest.mark.parametrize("T,n_expert,k,normalize", [(1, 128, 8, 1), (3, 100, 4, 0)])
def test_logits_then_topk_give_route_ref(route_lib, T, n_expert, k, normalize):
    rng = np.random.default_rng(T)
    n_embd = 96
    h = rng.standard_normal((T, n_embd)).astype(np.float32)
    w = rng.standard_normal((n_expert, n_embd)).astype(np.float32)
    i32 = np.int32
    lg = np.full((T, n_expert), np.nan, np.float32)
    route_lib.launch("moe_logits", (-(-T * n_expert // 4),), (128,), h, w, lg, i32(T), i32(n_embd), i32(n_expert))
    ids, wts = np.full((T, k), -1, np.int32), np.full((T, k), np.nan, np.float32)
    route_lib.launch("topk4", (-(-T // 4),), (128,), lg, ids, wts, i32(T), i32(n_expert), i32(k), i32(normalize))
    rid, rw = mk.route_ref(h.astype(np.float64) @ w.T.astype(np.float64), k, bool(normalize))
    np.testing.assert_array_equal(ids, rid)
    np.testing.assert_allclose(wts, rw, rtol=1e-5)


def test_combine_with_the_residual_is_the_add_after_it(route_lib):
    """moe_combine with res (the default for a decode token: the residual add after the MoE block)
    writes exactly res + (its output without res), in the same fp32."""
    rng = np.random.default_rng(11)
    T, k, n_embd = 2, 8, 300
    y = rng.standard_normal((T * k, n_embd)).astype(np.float32)
    w = rng.random((T, k)).astype(np.float32)
    res = (rng.standard_normal((T, n_embd)) * 10).astype(np.float32)
    pos = rng.permutation(T * k).astype(np.int32)
    plain, folded = (np.full((T, n_embd), np.nan, np.float32) for _ in range(2))
    # a thread a column (grid: column blocks, tokens)
    for out, r in ((plain, None), (folded, res)):
        route_lib.launch("moe_combine", (2, T), (256,), y, pos, w, out, np.int32(k), np.int32(n_embd), r)
    np.testing.assert_allclose(plain, mk.combine_ref(y, pos, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(folded, res + plain)
