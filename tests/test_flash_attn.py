"""The one-pass prefill attention kernel (kernels/flash_attention.py).

CPU CI: its NumPy twin (flash_fwd at the end of this file: the kernel's fragment and mask
arithmetic over NumPy models of mma.sync and ldmatrix) against a float64 attention. On a GPU: the kernel itself
against the same reference (head dim 256 too), and the engine with it against the engine with the
materialized path. The kernel itself also runs on the CPU: tests/test_flash_attn_emulated.py."""
import numpy as np
import pytest

from lite.backend_config import BackendConfig
from lite.backends import cuda_unavailable_reason
from lite.backends.cuda_attention import CUDAAttention
from lite.engine.engine import Engine
from lite.files.synth import synth

WHY = cuda_unavailable_reason()
needs_gpu = pytest.mark.skipif(WHY is not None, reason=f"needs a GPU: {WHY}")
LOG2E = 1.4426950408889634

# (D, T, H, Hkv, pos0, window): GQA, a chunk after a cached prefix, rows past a tile's end,
# windows that start inside the prefix, inside the chunk, and one wider than the context
CASES = [(64, 70, 4, 2, 50, 0), (128, 70, 4, 2, 50, 0), (64, 70, 4, 2, 50, 30),
         (128, 45, 4, 1, 100, 45), (64, 130, 2, 2, 0, 0), (128, 20, 2, 1, 7, 500)]


def make_inputs(D, T, H, Hkv, pos0, seed=5, S_max=None):
    rng = np.random.default_rng(seed)
    S_max = S_max or pos0 + T + 40
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    K = (rng.standard_normal((Hkv, S_max, D)) * 0.5).astype(np.float16)
    V = rng.standard_normal((Hkv, S_max, D)).astype(np.float16)
    K[:, pos0 + T:] = V[:, pos0 + T:] = np.float16(np.nan)     # past the chunk: must not be read
    return q, K, V


def reference(q, K, V, pos0, window, scale):
    T, H, D = q.shape
    Hkv, S = K.shape[0], pos0 + T
    qpos = pos0 + np.arange(T)[:, None]
    kpos = np.arange(S)[None, :]
    masked = (kpos > qpos) | ((qpos - kpos >= window) if window else False)
    out = np.empty((T, H, D))
    for h in range(H):
        hk = h // (H // Hkv)
        s = (q[:, h].astype(np.float16).astype(np.float64) @ K[hk, :S].T.astype(np.float64)) * scale
        s[masked] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h] = p @ V[hk, :S].astype(np.float64)
    return out


CASE_ID = "D{}-T{}-H{}/{}-pos{}-win{}".format
# query rows a CTA: 64 (4 warps) and 128 (8 warps), the tile sizes kernels/flash_attention.py may use
ROWS = [64, 128]


@pytest.mark.parametrize("bm", ROWS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: CASE_ID(*c))
def test_twin_matches_reference(case, bm):
    D, T, H, Hkv, pos0, window = case
    q, K, V = make_inputs(D, T, H, Hkv, pos0)
    scale = 1 / np.sqrt(D)
    got = flash_fwd(q, K, V, pos0, window, scale * LOG2E, BM=bm)
    np.testing.assert_allclose(got, reference(q, K, V, pos0, window, scale), rtol=1e-2, atol=1e-2)


@needs_gpu
@pytest.mark.parametrize("bm", ROWS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: CASE_ID(*c))
def test_flash_prefill_kernel_matches_reference(case, bm):
    import cupy as cp
    from lite.kernels.flash_attention import flash_prefill
    D, T, H, Hkv, pos0, window = case
    q, K, V = make_inputs(D, T, H, Hkv, pos0)
    scale = 1 / np.sqrt(D)
    got = flash_prefill(cp.asarray(q), cp.asarray(K), cp.asarray(V), pos0, window, scale,
                        cp.cuda.Stream.null, bm=bm).get()
    np.testing.assert_allclose(got, reference(q, K, V, pos0, window, scale), rtol=1e-2, atol=1e-2)


@needs_gpu
@pytest.mark.parametrize("bm", ROWS)
def test_flash_prefill_long_context(bm):
    """The 8B shape (GQA 32/8, D 128) over 3,000 cached positions, with and without a window."""
    import cupy as cp
    from lite.kernels.flash_attention import flash_prefill
    q, K, V = make_inputs(128, 300, 32, 8, 3000, seed=7)
    scale = 1 / np.sqrt(128)
    for window in (0, 1000):
        got = flash_prefill(cp.asarray(q), cp.asarray(K), cp.asarray(V), 3000, window, scale,
                            cp.cuda.Stream.null, bm=bm).get()
        np.testing.assert_allclose(got, reference(q, K, V, 3000, window, scale), rtol=1e-2, atol=1e-2)


# head dim 256 (Q's fragments from shared memory, 32-key tiles): qwen3next's gated attention
# (GQA 16/2) after a long prefix, gemma3's (2/1, 4/1) with its local window, partial tiles
CASES_256 = [(256, 70, 4, 2, 50, 0), (256, 45, 4, 1, 100, 45), (256, 20, 2, 1, 7, 500),
             (256, 300, 16, 2, 3000, 0), (256, 130, 2, 1, 600, 512)]


@needs_gpu
@pytest.mark.parametrize("bm", ROWS)
@pytest.mark.parametrize("case", CASES_256, ids=lambda c: CASE_ID(*c))
def test_flash_prefill_256_matches_reference(case, bm):
    import cupy as cp
    from lite.kernels.flash_attention import flash_prefill
    D, T, H, Hkv, pos0, window = case
    q, K, V = make_inputs(D, T, H, Hkv, pos0, seed=11)
    scale = 1 / np.sqrt(D)
    got = flash_prefill(cp.asarray(q), cp.asarray(K), cp.asarray(V), pos0, window, scale,
                        cp.cuda.Stream.null, bm=bm).get()
    # P rounded to fp16 moves an output by about 2^-11 max|V| (tests/test_flash_attn_emulated.py)
    atol = 2.0 ** -10 * float(np.abs(V[:, :pos0 + T]).max())
    np.testing.assert_allclose(got, reference(q, K, V, pos0, window, scale), rtol=0, atol=atol)


class _Backend(CUDAAttention):                       # the mixin's routing, no device behind it
    def __init__(self, **settings):
        self.config = BackendConfig(**settings)


@pytest.mark.parametrize("settings,takes", [
    ({}, {64: True, 128: True, 256: False, 96: False}),
    ({"flash_attention_256": True}, {64: True, 128: True, 256: True, 96: False}),
    ({"flash_attention": False, "flash_attention_256": True}, {64: False, 128: False, 256: False}),
])
def test_backend_routes_head_dims(settings, takes):
    """Head dim 256 reaches the kernel only with flash_attention_256 on (and flash_attention)."""
    backend = _Backend(**settings)
    assert {D: backend.flash_prefill_takes(D, D) for D in takes} == takes


@pytest.fixture(scope="module", params=[("llama", "Q4_K"), ("qwen3", "Q6_K"), ("gemma3", "Q4_K")],
                ids=lambda p: f"{p[0]}-{p[1]}")        # head dims 64, 128 and 256
def synth_model(request, tmp_path_factory):
    arch, quant = request.param
    path = tmp_path_factory.mktemp("synth") / f"{arch}-{quant}.gguf"
    synth(arch, "tiny", quant, str(path), seed=3)
    return str(path)


@needs_gpu
@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_flash_prefill_in_the_engine(synth_model, kv):
    """The flash kernel (head dim 256 with flash_attention_256) = the materialized path, through
    the f16 cache and the int8 one's f16 copy; gemma3's local layers exercise its window."""
    ids = list(range(3, 150))
    plain = Engine(synth_model, device="cuda", max_context=256, prefill_chunk=64, kv=kv,
                   config=BackendConfig(flash_attention=False))
    want = plain.prefill(ids, all_logits=True)
    flash = Engine(synth_model, device="cuda", max_context=256, prefill_chunk=64, kv=kv,
                   config=BackendConfig(flash_attention=True, flash_attention_256=True))
    got = flash.prefill(ids, all_logits=True)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())


# === The NumPy twin of the kernel ===
#
# A NumPy twin of the CUDA kernel of kernels/flash_attention.py (kernels/cuda/flash_attention.cu),
# lane by lane, for CPU CI.
#
# The kernel's index arithmetic (which lane loads which Q element, which shared-memory rows each
# ldmatrix lane points at, how S accumulators become P's A fragments, the masks, the online softmax)
# is transcribed here line for line, and run against NumPy models of the PTX instructions built from
# the PTX ISA's fragment tables (mma.m16n8k16 .f16/.f32, ldmatrix .m8n8 with and without .trans).
# A wrong fragment index in the kernel is then a wrong index here, which the reference catches
# without a GPU. Registers are arrays over the 32 lanes: a .f16x2 register is (32, 2) float16.

BN = 64
LANE = np.arange(32)
G_ROW, T_COL = LANE >> 2, LANE & 3          # accumulator row (lane/4), column pair (lane%4)
M_IDX, M_ROW = LANE >> 3, LANE & 7          # ldmatrix: matrix of this lane's address, its row


# --- the PTX instructions, from the ISA's fragment tables -----------------------------------------
def mma_16816(c, a, b0, b1):
    """c (32, 4) f32 += A (16x16, from a: 4 registers) @ B (16x8, from b0, b1), fp32 accumulate."""
    A = np.zeros((16, 16), np.float32)
    B = np.zeros((16, 8), np.float32)
    for j in range(2):                       # the element pair of a .f16x2 register
        A[G_ROW, 2 * T_COL + j] = a[0][:, j]
        A[G_ROW + 8, 2 * T_COL + j] = a[1][:, j]
        A[G_ROW, 2 * T_COL + 8 + j] = a[2][:, j]
        A[G_ROW + 8, 2 * T_COL + 8 + j] = a[3][:, j]
        B[2 * T_COL + j, G_ROW] = b0[:, j]
        B[2 * T_COL + 8 + j, G_ROW] = b1[:, j]
    D = A @ B
    out = c.copy()
    out[:, 0] += D[G_ROW, 2 * T_COL]
    out[:, 1] += D[G_ROW, 2 * T_COL + 1]
    out[:, 2] += D[G_ROW + 8, 2 * T_COL]
    out[:, 3] += D[G_ROW + 8, 2 * T_COL + 1]
    return out


def ldmatrix_x4(smem, row, col, trans=False):
    """Four 8x8 b16 matrices; lane l gives the address (row[l], col[l]) of row l%8 of matrix l//8.
    Returns 4 registers (32, 2): element (lane/4, 2*(lane%4)+j) of each matrix, or with .trans
    element (2*(lane%4)+j, lane/4)."""
    regs = []
    for i in range(4):
        mat = np.stack([smem[row[8 * i + k], col[8 * i + k]:col[8 * i + k] + 8] for k in range(8)])
        r = np.empty((32, 2), np.float16)
        for j in range(2):
            r[:, j] = mat[2 * T_COL + j, G_ROW] if trans else mat[G_ROW, 2 * T_COL + j]
        regs.append(r)
    return regs


def pack_half2(lo, hi):
    return np.stack([lo, hi], axis=1).astype(np.float16)


def shfl_xor(x, m):
    return x[LANE ^ m]


# --- the kernel, transcribed ---------------------------------------------------------------------
def flash_fwd(q, K, V, pos0, window, scale_log2, BM=64):
    """Same arguments and result as the CUDA kernel (BM: its query rows a CTA): q (T, H, D) f32,
    K, V (Hkv, S_max, D) f16."""
    T, H, D = q.shape
    Hkv = K.shape[0]
    KS = D + 8
    out = np.full((T, H, D), np.nan, np.float32)            # rows the kernel never writes stay NaN
    G, n_qt = H // Hkv, (T + BM - 1) // BM
    for by in range(Hkv):
        for bx in range(n_qt * G):
            _cta(q, K, V, out, T, H, D, KS, BM, pos0, window, scale_log2, G, n_qt, bx, by)
    return out


def _cta(q, K, V, out, T, H, D, KS, BM, pos0, window, scale_log2, G, n_qt, bx, by):
    h, hk = by * G + bx % G, by
    t0 = (n_qt - 1 - bx // G) * BM
    S = pos0 + T
    first_qp, last_qp = pos0 + t0, pos0 + min(T, t0 + BM) - 1
    k_begin = max(0, first_qp - window + 1) if window > 0 else 0
    k_begin -= k_begin % BN
    n_tiles = (last_qp + 1 - k_begin + BN - 1) // BN
    qf = q.reshape(-1)
    for warp in range(BM // 16):                             # warps share only the K/V tiles
        r0 = t0 + warp * 16 + G_ROW
        r1 = r0 + 8
        qp0, qp1 = pos0 + r0, pos0 + r1

        def qload(r, c):
            idx = np.where(r < T, (r * H + h) * D + 2 * T_COL + c, 0)
            lo, hi = qf[idx], qf[idx + 1]
            return np.where((r < T)[:, None], pack_half2(lo, hi), np.float16(0))

        qa = [[qload(r0, kk * 16), qload(r1, kk * 16), qload(r0, kk * 16 + 8), qload(r1, kk * 16 + 8)]
              for kk in range(D // 16)]
        o = np.zeros((D // 8, 32, 4), np.float32)
        m0 = np.full(32, -np.inf, np.float32)
        m1 = m0.copy()
        l0 = np.zeros(32, np.float32)
        l1 = l0.copy()
        for it in range(n_tiles):
            kt = k_begin + it * BN
            ks = np.zeros((BN, KS), np.float16)              # cp.async: zero-filled past S
            vs = np.zeros((BN, KS), np.float16)
            for r in range(BN):
                j = kt + r
                if j < S:
                    ks[r, :D], vs[r, :D] = K[hk, j], V[hk, j]
            s = np.zeros((BN // 8, 32, 4), np.float32)
            for kk in range(D // 16):
                for np_ in range(BN // 16):
                    b = ldmatrix_x4(ks, np_ * 16 + (M_IDX >> 1) * 8 + M_ROW, kk * 16 + (M_IDX & 1) * 8)
                    s[2 * np_] = mma_16816(s[2 * np_], qa[kk], b[0], b[1])
                    s[2 * np_ + 1] = mma_16816(s[2 * np_ + 1], qa[kk], b[2], b[3])
            edge = kt + BN - 1 > first_qp or (window > 0 and last_qp - kt >= window)
            s *= np.float32(scale_log2)
            if edge:
                for n in range(BN // 8):
                    for e in range(4):
                        j = kt + n * 8 + 2 * T_COL + (e & 1)
                        qp = qp0 if e < 2 else qp1
                        masked = (j > qp) | ((qp - j >= window) if window > 0 else False)
                        s[n, :, e] = np.where(masked, -np.inf, s[n, :, e])
            mx0 = np.maximum(m0, np.maximum(s[:, :, 0], s[:, :, 1]).max(axis=0))
            mx1 = np.maximum(m1, np.maximum(s[:, :, 2], s[:, :, 3]).max(axis=0))
            for m in (1, 2):
                mx0 = np.maximum(mx0, shfl_xor(mx0, m))
                mx1 = np.maximum(mx1, shfl_xor(mx1, m))
            base0 = np.where(mx0 == -np.inf, 0, mx0).astype(np.float32)
            base1 = np.where(mx1 == -np.inf, 0, mx1).astype(np.float32)
            alpha0, alpha1 = np.exp2(m0 - base0), np.exp2(m1 - base1)
            m0, m1 = mx0, mx1
            l0, l1 = l0 * alpha0, l1 * alpha1
            o[:, :, 0:2] *= alpha0[None, :, None]
            o[:, :, 2:4] *= alpha1[None, :, None]
            s[:, :, 0:2] = np.exp2(s[:, :, 0:2] - base0[None, :, None])
            s[:, :, 2:4] = np.exp2(s[:, :, 2:4] - base1[None, :, None])
            l0 = l0 + (s[:, :, 0] + s[:, :, 1]).sum(axis=0)
            l1 = l1 + (s[:, :, 2] + s[:, :, 3]).sum(axis=0)
            for kk in range(BN // 16):
                pa = [pack_half2(s[2 * kk, :, 0], s[2 * kk, :, 1]),
                      pack_half2(s[2 * kk, :, 2], s[2 * kk, :, 3]),
                      pack_half2(s[2 * kk + 1, :, 0], s[2 * kk + 1, :, 1]),
                      pack_half2(s[2 * kk + 1, :, 2], s[2 * kk + 1, :, 3])]
                for dp in range(D // 16):
                    b = ldmatrix_x4(vs, kk * 16 + (M_IDX & 1) * 8 + M_ROW, dp * 16 + (M_IDX >> 1) * 8,
                                    trans=True)
                    o[2 * dp] = mma_16816(o[2 * dp], pa, b[0], b[1])
                    o[2 * dp + 1] = mma_16816(o[2 * dp + 1], pa, b[2], b[3])
        for m in (1, 2):
            l0 = l0 + shfl_xor(l0, m)
            l1 = l1 + shfl_xor(l1, m)
        with np.errstate(divide="ignore"):
            inv0 = np.where(l0 > 0, 1 / l0, 0).astype(np.float32)
            inv1 = np.where(l1 > 0, 1 / l1, 0).astype(np.float32)
        for lane in range(32):
            for n in range(D // 8):
                c = n * 8 + 2 * T_COL[lane]
                if r0[lane] < T:
                    out[r0[lane], h, c:c + 2] = o[n, lane, 0:2] * inv0[lane]
                if r1[lane] < T:
                    out[r1[lane], h, c:c + 2] = o[n, lane, 2:4] * inv1[lane]
