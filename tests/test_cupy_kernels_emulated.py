"""The CUDA C of the decode step (kernels/decode_attention*.py, kernels/small_ops.py),
compiled with g++ against tests/cuda_c_emulator.py and run through the real Python wrappers (a
stand-in `cupy` module hands them NumPy arrays), against NumPy and the CPU backend's own code.
No GPU needed; skips without g++."""
import sys
import types

import numpy as np
import pytest

from cuda_c_emulator import available, emulated_kernels

pytestmark = pytest.mark.skipif(not available(), reason="needs g++ (C++20) to emulate CUDA C")


@pytest.fixture(scope="module")
def emulated():
    """(small_ops, decode_attention) imported against the emulating `cupy`."""
    with emulated_kernels("small_ops", "decode_attention") as mods:
        yield mods["small_ops"], mods["decode_attention"]


def test_add_rms_norm(emulated):
    ops, _ = emulated
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((3, 300)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(300).astype(np.float32)
    s, y = ops.add_rms_norm(a, b, w, 1e-5, None)
    want = a + b
    np.testing.assert_array_equal(s, want)
    ms = np.mean(want.astype(np.float64) ** 2, axis=-1, keepdims=True)
    np.testing.assert_allclose(y, want / np.sqrt(ms + 1e-5) * w, rtol=1e-5, atol=1e-6)


def test_rms_norm(emulated):
    ops, _ = emulated
    rng = np.random.default_rng(1)
    for rows, n in ((3, 300), (2, 2048), (1, 7)):      # several warps, a full block, one warp
        x = rng.standard_normal((rows, n)).astype(np.float32)
        w = rng.standard_normal(n).astype(np.float32)
        y = ops.rms_norm(x, w, 1e-5, None)
        ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
        np.testing.assert_allclose(y, x / np.sqrt(ms + 1e-5) * w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [0, 5])
def test_masked_softmax(emulated, window):
    """Causal (and sliding-window) softmax of G*T score rows against NumPy, in place and as fp16."""
    ops, _ = emulated
    rng = np.random.default_rng(2)
    G, T, pos0, scale = 2, 6, 40, 0.125
    S = pos0 + T
    scores = rng.standard_normal((G * T, S)).astype(np.float32) * 8
    qpos = pos0 + np.arange(G * T)[:, None] % T
    k = np.arange(S)[None, :]
    masked = (k > qpos) | ((qpos - k >= window) if window else False)
    z = np.where(masked, -np.inf, scores.astype(np.float64) * scale)
    p = np.exp(z - z.max(-1, keepdims=True))
    want = p / p.sum(-1, keepdims=True)
    got = ops.masked_softmax(scores.copy(), T, pos0, window, scale, None)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
    p16 = np.empty((G * T, S), np.float16)
    ops.masked_softmax(scores.copy(), T, pos0, window, scale, None, p16=p16)
    np.testing.assert_allclose(p16.astype(np.float64), want, rtol=2e-3, atol=1e-4)


def _cpu_rope(x, pos, base, neox, n_rot, freq_scale):
    from lite.backends.cpu import CPUBackend
    return CPUBackend.rope(None, x[None], pos, base, neox, n_rot, freq_scale)[0]


@pytest.mark.parametrize("kind", ["f16", "int8"])
@pytest.mark.parametrize("neox,n_rot", [(False, 64), (True, 32)])
def test_rope_kv_store(emulated, kind, neox, n_rot):
    _check_rope_kv_store(emulated[1], kind, neox, n_rot)


def _check_rope_kv_store(dec, kind, neox, n_rot, pdl=False):
    from lite.engine.kv_cache import KVCache
    rng = np.random.default_rng(1)
    H, Hkv, D, Dv, S, pos = 6, 2, 64, 48, 40, 17
    q = rng.standard_normal((H, D)).astype(np.float32)
    k = rng.standard_normal((Hkv, D)).astype(np.float32)
    v = rng.standard_normal((Hkv, Dv)).astype(np.float32)
    dt = np.float16 if kind == "f16" else np.int8
    K, V = np.zeros((Hkv, S, D), dt), np.zeros((Hkv, S, Dv), dt)
    ks = vs = None
    if kind == "int8":
        ks, vs = np.zeros((Hkv, S), np.float32), np.zeros((Hkv, S), np.float32)
    pos_dev = np.array([pos], np.int64)
    rope = (n_rot, 10000.0, 0.5, neox)
    q_out = dec.rope_kv_store(q, k, v, K, V, ks, vs, pos_dev, rope, None, pdl=pdl)
    np.testing.assert_allclose(q_out, _cpu_rope(q, pos, 10000.0, neox, n_rot, 0.5), atol=1e-5)
    k_rot = _cpu_rope(k, pos, 10000.0, neox, n_rot, 0.5)
    others = np.ones(S, bool)
    others[pos] = False
    assert not K[:, others].any() and not V[:, others].any()      # only row pos written
    if kind == "f16":
        np.testing.assert_allclose(K[:, pos].astype(np.float32), k_rot, rtol=1e-3, atol=1e-3)
        np.testing.assert_array_equal(V[:, pos], v.astype(np.float16))
    else:
        quant = KVCache._quantize(types.SimpleNamespace(xp=np), np.stack([k_rot, k_rot]))
        np.testing.assert_allclose(ks[:, pos], quant[1][:, 0], rtol=1e-6)
        assert np.abs(K[:, pos].astype(int) - quant[0][:, 0].astype(int)).max() <= 1
        qv, sv = KVCache._quantize(types.SimpleNamespace(xp=np), v[None])
        np.testing.assert_array_equal(V[:, pos], qv[:, 0])
        np.testing.assert_array_equal(vs[:, pos], sv[:, 0])


def _np_rms_norm(x, w, eps):
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    return (x / np.sqrt(ms + eps) * w).astype(np.float32)


@pytest.mark.parametrize("kind", ["f16", "int8"])
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("D,n_rot,H,Hkv,which", [
    (64, 64, 6, 2, "qk"), (128, 128, 8, 2, "qk"),       # GQA 3 and 4 heads a KV head
    (128, 64, 4, 4, "qk"), (128, 128, 8, 1, "q"), (80, 80, 4, 2, "k")])   # partial rotation, one norm
def test_rope_kv_store_qk_norm(emulated, kind, neox, D, n_rot, H, Hkv, which):
    """Per-head RMSNorm folded into rope_kv_store: against NumPy (norm, RoPE, store), and bit for
    bit against the separate launches (rms_norm kernel, then rope_kv_store without the norm)."""
    ops, dec = emulated
    rng = np.random.default_rng(D + H)
    Dv, S, pos, eps = D, 24, 11, 1e-6
    q = rng.standard_normal((H, D)).astype(np.float32) * 3
    k = rng.standard_normal((Hkv, D)).astype(np.float32) * 3
    v = rng.standard_normal((Hkv, Dv)).astype(np.float32)
    wq = (rng.random(D) + 0.5).astype(np.float32) if "q" in which else None
    wk = (rng.random(D) + 0.5).astype(np.float32) if "k" in which else None
    dt = np.float16 if kind == "f16" else np.int8
    pos_dev = np.array([pos], np.int64)
    rope = (n_rot, 1000000.0, 1.0, neox)

    def caches():
        K, V = np.zeros((Hkv, S, D), dt), np.zeros((Hkv, S, Dv), dt)
        ks = vs = None
        if kind == "int8":
            ks, vs = np.zeros((Hkv, S), np.float32), np.zeros((Hkv, S), np.float32)
        return K, V, ks, vs

    fused = caches()
    q_out = dec.rope_kv_store(q, k, v, *fused, pos_dev, rope, None, norm=(wq, wk, eps))
    apart = caches()
    qn = q if wq is None else ops.rms_norm(q, wq, eps, None)
    kn = k if wk is None else ops.rms_norm(k, wk, eps, None)
    q_apart = dec.rope_kv_store(qn, kn, v, *apart, pos_dev, rope, None)
    np.testing.assert_array_equal(q_out, q_apart)
    for a, b in zip(fused, apart):
        if a is not None:
            np.testing.assert_array_equal(a, b)

    K, V, ks, vs = fused
    q_want, k_want = (_cpu_rope(x if w is None else _np_rms_norm(x, w, eps), pos, 1000000.0, neox,
                                n_rot, 1.0) for x, w in ((q, wq), (k, wk)))
    np.testing.assert_allclose(q_out, q_want, rtol=1e-5, atol=1e-5)
    others = np.ones(S, bool)
    others[pos] = False
    assert not K[:, others].any() and not V[:, others].any()
    if kind == "f16":
        np.testing.assert_allclose(K[:, pos].astype(np.float32), k_want, rtol=1e-3, atol=2e-3)
        np.testing.assert_array_equal(V[:, pos], v.astype(np.float16))
    else:
        k_deq = K[:, pos].astype(np.float32) * ks[:, pos, None]
        np.testing.assert_allclose(k_deq, k_want, atol=0.51 * ks[:, pos, None].max() + 1e-6)
        np.testing.assert_allclose(ks[:, pos], np.abs(k_want).max(-1) / 127, rtol=1e-5)


def decode_attention_reference(q, K, V, ks, vs, pos, scale, window):
    H, D = q.shape
    Hkv = K.shape[0]
    Kf, Vf = K.astype(np.float64), V.astype(np.float64)
    if ks is not None:
        Kf, Vf = Kf * ks[..., None], Vf * vs[..., None]
    j0 = max(0, pos - window + 1) if window else 0
    out = np.empty((H, V.shape[2]))
    for h in range(H):
        hk = h // (H // Hkv)
        s = Kf[hk, j0:pos + 1] @ q[h] * scale
        p = np.exp(s - s.max())
        out[h] = p @ Vf[hk, j0:pos + 1] / p.sum()
    return out


def _cache(rng, kind, Hkv, S, D, Dv):
    if kind == "f16":
        K = rng.standard_normal((Hkv, S, D)).astype(np.float16)
        V = rng.standard_normal((Hkv, S, Dv)).astype(np.float16)
        return K, V, None, None
    K = rng.integers(-127, 128, (Hkv, S, D)).astype(np.int8)
    V = rng.integers(-127, 128, (Hkv, S, Dv)).astype(np.int8)
    ks = (rng.random((Hkv, S)) * 0.02).astype(np.float32)
    vs = (rng.random((Hkv, S)) * 0.02).astype(np.float32)
    return K, V, ks, vs


def _check_attn_decode(dec, variant, kind, H, Hkv, S, positions, window, D=64, Dv=64, pdl=False):
    """variant "tiled": the tiled kernel called directly (it serves the head dims the default
    lacks); None: decode_attention.attention."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((H, D)).astype(np.float32)
    K, V, ks, vs = _cache(rng, kind, Hkv, S, D, Dv)
    counters = dec.new_counters(64)
    attend = dec.tiled_attention if variant == "tiled" else dec.attention
    for pos in positions:
        out = attend(q, K, V, ks, vs, np.array([pos], np.int64), 0.125, window, counters, None,
                     pdl=pdl)
        want = decode_attention_reference(q, K, V, ks, vs, pos, 0.125, window)
        np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-4 * np.abs(want).max(),
                                   err_msg=f"{variant} pos {pos}")
        assert not counters.any()          # handed back zeroed for the next launch


@pytest.mark.parametrize("variant", ["tiled", None])
@pytest.mark.parametrize("kind,H,Hkv,S,positions,window", [
    (kind, *case) for kind in ("f16", "int8") for case in [
        (8, 2, 1000, [0, 1, 7, 8, 63, 64, 500, 998, 999], 0),   # G=4: one block column a KV head
        (6, 2, 300, [0, 130, 299], 0),               # G=3: a column with an idle warp
        (12, 2, 300, [70, 299], 100),                # G=6: two columns a KV head, sliding window
    ]] + [("f16", 4, 1, 20000, [19999], 0)])         # splits longer than a tile (several tiles)
def test_attn_decode_matches_reference(emulated, variant, kind, H, Hkv, S, positions, window):
    _check_attn_decode(emulated[1], variant, kind, H, Hkv, S, positions, window)


@pytest.mark.parametrize("kind", ["f16", "int8"])
@pytest.mark.parametrize("D,Dv", [(128, 128), (256, 256), (96, 64)])
def test_attn_decode_head_dims(emulated, kind, D, Dv):
    """The kernel is compiled per head dims: the 8B shape's 128, Gemma's 256, and unequal/odd ones."""
    dec = emulated[1]
    assert dec.supports(D, Dv, kind == "int8")
    _check_attn_decode(dec, None, kind, 8, 2, 700, [0, 129, 699], 0, D, Dv)


@pytest.mark.parametrize("kind,D,Dv", [("int8", 40, 40), ("f16", 24, 24), ("f16", 64, 320)])
def test_attn_decode_takes_the_tiled_kernel_where_the_default_lacks_the_dims(emulated, kind, D, Dv):
    """int8 rows that are no whole 16-byte pieces, key dims below 32, value dims above 256: the
    default kernel cannot serve them, the tiled one does."""
    dec = emulated[1]
    assert not dec.supports(D, Dv, kind == "int8")
    assert dec.supports(40, 40, False)
    _check_attn_decode(dec, None, kind, 8, 2, 200, [0, 199], 0, D, Dv)


@pytest.mark.parametrize("kind", ["f16", "int8"])
@pytest.mark.parametrize("defer_k", [True, False])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_backend_decode_attention_matches_cpu(emulated, kind, defer_k, qk_norm):
    """CUDABackend's one-token path (rope left for attention, rope_kv_store, attention) against
    the CPU backend's rope and attention over the same cache; defer_k=False: only q's rotation was
    left, so the backend rotates it with the rope kernel and stores k as it came. qk_norm: q and k
    come from norm_later (what rms_norm returns with fold_qk_norm on), so their per-head
    norms are applied in rope_kv_store (or, for a rotation done early, by the rms_norm kernel)."""
    from lite.backends.cpu import CPUBackend
    from lite.backends.cuda_attention import CUDAAttention, NormLater
    from lite.engine.kv_cache import KVCache
    ops, dec = emulated
    rng = np.random.default_rng(3)
    H, Hkv, D, S, pos, il, eps = 8, 2, 64, 600, 321, 0, 1e-6
    cfg = types.SimpleNamespace(n_head_kv=Hkv, head_dim=D, v_head_dim=D,
                                is_recurrent_layer=lambda il: False)
    caches = [KVCache(cfg, [il], S, kind) for _ in range(2)]
    past = rng.standard_normal((2, pos, Hkv, D)).astype(np.float32)
    for c in caches:
        c.write(il, past[0], past[1], 0)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    k, v = rng.standard_normal((2, 1, Hkv, D)).astype(np.float32)
    rope = (10000.0, True, D, 1.0)
    w = {n: (rng.random(D) + 0.5).astype(np.float32) for n in ("qn", "kn")}

    gpu = CUDAAttention()
    gpu.cp, gpu.small_ops, gpu.decode_attn, gpu.stream, gpu.pdl = np, ops, dec, None, False
    gpu.pos_dev, gpu.attn_counters = np.array([pos], np.int64), dec.new_counters(16)
    gpu.w = {n: types.SimpleNamespace(data=a) for n, a in w.items()}
    cpu = types.SimpleNamespace(w=w)
    q_in, k_in, q_ref, k_ref = q, k, q, k
    if qk_norm:
        q_in, k_in = gpu.norm_later(q, "qn", eps), gpu.norm_later(k, "kn", eps)
        assert isinstance(q_in, NormLater) and isinstance(k_in, NormLater)
        with pytest.raises(TypeError):
            q_in.reshape(1, -1)                   # nothing but rope and attention takes it
        q_ref, k_ref = CPUBackend.rms_norm(cpu, q, "qn", eps), CPUBackend.rms_norm(cpu, k, "kn", eps)
    q_later = gpu.rope(q_in, pos, *rope)
    k_in = gpu.rope(k_in, pos, *rope) if defer_k else CPUBackend.rope(None, k_ref, pos, *rope)
    got = gpu._attention_decode(caches[0], il, q_later, k_in, v, 0.125, 0)

    want = CPUBackend.attention(CPUBackend.__new__(CPUBackend), caches[1], il, CPUBackend.rope(None, q_ref, pos, *rope),
                                CPUBackend.rope(None, k_ref, pos, *rope), v, pos, 0.125)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
    if kind == "f16":        # the new key row as the CPU stored it
        np.testing.assert_allclose(caches[0].k[il][:, pos].astype(np.float32),
                                   caches[1].k[il][:, pos].astype(np.float32), rtol=2e-3, atol=2e-3)


def test_fold_qk_norm_setting():
    """The folding is on by default (BackendConfig.fold_qk_norm), the backend's config says."""
    from lite.backend_config import BackendConfig
    from lite.backends.cuda_attention import CUDAAttention
    b = CUDAAttention()
    b.config = BackendConfig()
    assert b.fold_qk_norm
    b.config = BackendConfig(fold_qk_norm=False)
    assert not b.fold_qk_norm


class _QKNormOps:
    """The ops models/llama.py's attention_block calls for one token: fixed q, k, v products, and
    rms_norm with the hook proposed for lite/backends/cuda.py's CUDABackend.rms_norm (fold off:
    the rms_norm kernel, as now). `emulated` mixes in CUDAAttention; `cpu` the CPU's ops."""

    def __init__(self, qkv, weights, emulated=None, config=None):
        self.qkv, self.launches, self.config, self.pdl = qkv, [], config, False
        if emulated:
            self.cp, self.xp, self.stream = np, np, None
            self.small_ops, self.decode_attn = emulated
            self.w = {n: types.SimpleNamespace(data=a) for n, a in weights.items()}
        else:
            self.w = weights

    def linear_many(self, h, names):
        return [a.reshape(1, -1) for a in self.qkv]

    def linear(self, x, name):
        return x


def _hooked_rms_norm(self, x, name, eps):
    if x.ndim == 3 and x.shape[0] == 1 and self.fold_qk_norm:   # a decode token's q or k heads:
        return self.norm_later(x, name, eps)                   # normed in rope_kv_store
    self.launches.append(name)
    return self.small_ops.rms_norm(self.cp.ascontiguousarray(x), self.w[name].data, eps, self.stream)


@pytest.mark.parametrize("fold", ["0", "1"])
def test_qwen3_attention_block_folds_qk_norm(emulated, fold):
    """models/llama.py's attention_block (qk_norm) for one decode token through the mixin with the
    proposed rms_norm hook: no norm launch with fold_qk_norm on, same output as the CPU ops."""
    from lite.backend_config import BackendConfig
    from lite.backends.cpu import CPUBackend
    from lite.backends.cuda_attention import CUDAAttention
    from lite.engine.kv_cache import KVCache
    from lite.models.llama import attention_block
    H, Hkv, D, S, pos, il = 8, 2, 128, 300, 200, 1
    cfg = types.SimpleNamespace(n_head=H, n_head_kv=Hkv, head_dim=D, v_head_dim=D, qk_norm=True,
                                rms_eps=1e-6, rope_neox=True, rope_dim=D, attn_scale=D ** -0.5,
                                layer_rope_base=lambda il: 1e6, layer_rope_scale=lambda il: 1.0,
                                is_recurrent_layer=lambda il: False)
    rng = np.random.default_rng(4)
    qkv = [rng.standard_normal(n * D).astype(np.float32) * 4 for n in (H, Hkv, Hkv)]
    p = f"blk.{il}."
    names = [p + "attn_q_norm.weight", p + "attn_k_norm.weight"]
    w = {n: (rng.random(D) + 0.5).astype(np.float32) for n in names}
    caches = [KVCache(cfg, [il], S, "f16") for _ in range(2)]
    past = rng.standard_normal((2, pos, Hkv, D)).astype(np.float32)
    for c in caches:
        c.write(il, past[0], past[1], 0)

    class GPU(_QKNormOps, CUDAAttention):
        rms_norm = _hooked_rms_norm

        def attention(self, kv, il, q, k, v, pos0, scale, window=0):
            return self._attention_decode(kv, il, q, k, v, scale, window)
    gpu = GPU(qkv, w, emulated, BackendConfig(fold_qk_norm=fold == "1"))
    gpu.pos_dev, gpu.attn_counters = np.array([pos], np.int64), emulated[1].new_counters(16)

    class CPU(_QKNormOps):
        rms_norm, rope, attention = CPUBackend.rms_norm, CPUBackend.rope, CPUBackend.attention
        attend, pad_rows, _attend = CPUBackend.attend, False, staticmethod(CPUBackend._attend)   # attention's own parts
    h = np.zeros((1, 16), np.float32)          # the products ignore it
    got = attention_block(gpu, cfg, il, h, caches[0], pos)
    want = attention_block(CPU(qkv, w), cfg, il, h, caches[1], pos)
    assert gpu.launches == ([] if fold == "1" else names)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_decode_launches_pack_for_programmatic_launch(emulated, monkeypatch):
    """pdl=True's launch path (kernels/pdl.py) for RoPE + KV store and both attention kernels:
    every argument the wrappers pass packs for cuLaunchKernelEx (a TypeError there would surface
    only on the GPU), and the kernels, launched through it (the emulator stands in for the driver;
    the PDL prologue is empty without LT_PDL), still match the reference."""
    from lite.kernels import pdl
    packed = []

    def launch(func, grid, block, args, stream_ptr, shared_mem=0):
        packed.append(len(pdl.pack(args)[0]))
        func(grid, block, args, shared_mem=shared_mem)

    monkeypatch.setattr(pdl, "source_head", lambda use_pdl=False: "")   # no griddepcontrol on the host
    monkeypatch.setattr(pdl, "launch", launch)
    current = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=0))
    monkeypatch.setattr(sys.modules["cupy"], "cuda", current, raising=False)   # the stand-in cupy
    for variant in ("tiled", None):
        _check_attn_decode(emulated[1], variant, "f16", 8, 2, 300, [0, 299], 0, pdl=True)
    _check_rope_kv_store(emulated[1], "int8", True, 32, pdl=True)
    assert len(packed) >= 5 and all(n > 10 for n in packed)
