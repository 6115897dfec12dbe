"""The one-pass prefill attention kernel (kernels/flash_attention.py).

CPU CI: its NumPy twin (tests/flash_attn_twin.py: the kernel's fragment and mask arithmetic over
NumPy models of mma.sync and ldmatrix) against a float64 attention. On a GPU: the kernel itself
against the same reference, and the engine with it against the engine with the materialized path."""
import numpy as np
import pytest

from flash_attn_twin import flash_fwd
from lite.backend_config import BackendConfig
from lite.backends import cuda_unavailable_reason
from lite.engine import Engine
from lite.synth import synth

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


@pytest.fixture(scope="module", params=[("llama", "Q4_K"), ("qwen3", "Q6_K")],
                ids=lambda p: f"{p[0]}-{p[1]}")        # head dims 64 and 128
def synth_model(request, tmp_path_factory):
    arch, quant = request.param
    path = tmp_path_factory.mktemp("synth") / f"{arch}-{quant}.gguf"
    synth(arch, "tiny", quant, str(path), seed=3)
    return str(path)


@needs_gpu
@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_flash_prefill_in_the_engine(synth_model, kv):
    ids = list(range(3, 150))
    plain = Engine(synth_model, device="cuda", max_context=256, prefill_chunk=64, kv=kv,
                   config=BackendConfig(flash_attention=False))
    want = plain.prefill(ids, all_logits=True)
    flash = Engine(synth_model, device="cuda", max_context=256, prefill_chunk=64, kv=kv,
                   config=BackendConfig(flash_attention=True))
    got = flash.prefill(ids, all_logits=True)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
