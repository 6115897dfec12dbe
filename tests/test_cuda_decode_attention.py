"""Decode-step attention on the GPU (kernels/decode_attention.py; runs on the GPU machine, skips
elsewhere): the kernels at the 8B model's head shape against NumPy (the default kernel and the tiled
one, and the two against each other), and whole decode steps against the CPU backend at contexts that
span several splits, with the q/k norms folded into the rope-store and not. The rest of the GPU
backend against the CPU: tests/test_cuda_backend.py."""
import numpy as np
import pytest

from lite.backend_config import BackendConfig
from lite.backends import cuda_unavailable_reason
from lite.engine.engine import Engine
from lite.files.synth import synth
from test_cupy_kernels_emulated import decode_attention_reference

WHY = cuda_unavailable_reason()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"needs a GPU: {WHY}")


def _cache_8b(kind, S, seed=0, heads=(32, 8, 128)):
    rng = np.random.default_rng(seed)
    H, Hkv, D = heads
    q = rng.standard_normal((H, D)).astype(np.float32)
    if kind == "f16":
        K = rng.standard_normal((Hkv, S, D)).astype(np.float16)
        V = rng.standard_normal((Hkv, S, D)).astype(np.float16)
        ks = vs = None
    else:
        K = rng.integers(-127, 128, (Hkv, S, D)).astype(np.int8)
        V = rng.integers(-127, 128, (Hkv, S, D)).astype(np.int8)
        ks = (rng.random((Hkv, S)) * 0.02).astype(np.float32)
        vs = (rng.random((Hkv, S)) * 0.02).astype(np.float32)
    return q, K, V, ks, vs


def _run(variant, dev, pos, window, counters, stream):
    import cupy as cp
    from lite.kernels import decode_attention
    attend = decode_attention.tiled_attention if variant == "tiled" else decode_attention.attention
    out = attend(*dev, cp.asarray([pos], np.int64), 0.088, window, counters, stream)
    got = cp.asnumpy(out, stream=stream)
    stream.synchronize()
    assert not cp.asnumpy(counters).any()
    return got


@pytest.mark.parametrize("variant", ["tiled", "default"])
@pytest.mark.parametrize("kind", ["f16", "int8"])
@pytest.mark.parametrize("window", [0, 700])
@pytest.mark.parametrize("heads", [(32, 8, 128), (4, 1, 256)], ids=["8b", "gemma3-256"])
def test_attn_decode_8b_shape(variant, kind, window, heads):
    """The 8B head shape, and Gemma 3 270M's (4 heads, 1 KV head, dim 256)."""
    import cupy as cp
    from lite.kernels import decode_attention
    S = 8448
    host = _cache_8b(kind, S, heads=heads)
    dev = [None if a is None else cp.asarray(a) for a in host]
    # the copies ran on the legacy default stream, which a non-blocking stream does not wait
    # for: without this the kernels may read the cache before it has landed
    cp.cuda.runtime.deviceSynchronize()
    counters = decode_attention.new_counters()
    stream = cp.cuda.Stream(non_blocking=True)
    # the default kernel at S 8448: 33 splits of >= 64 keys; 63/64/255/256 cross its one- and two-split edges
    for pos in (0, 1, 63, 64, 100, 255, 256, 511, 4000, 8191, 8192, 8447):
        got = _run(variant, dev, pos, window, counters, stream)
        want = decode_attention_reference(*host, pos, 0.088, window)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max(),
                                   err_msg=f"{variant} pos {pos}")


@pytest.mark.parametrize("kind", ["f16", "int8"])
@pytest.mark.parametrize("S", [768, 32768])
def test_attn_decode_matches_the_tiled_kernel(kind, S):
    """The two kernels on the same cache, and the default one replayed from one captured graph
    (the position changes between replays, as in a decode graph)."""
    import cupy as cp
    from lite.kernels import decode_attention
    host = _cache_8b(kind, S, seed=1)
    dev = [None if a is None else cp.asarray(a) for a in host]
    # the copies ran on the legacy default stream, which a non-blocking stream does not wait
    # for: without this the kernels may read the cache before it has landed
    cp.cuda.runtime.deviceSynchronize()
    counters = decode_attention.new_counters()
    stream = cp.cuda.Stream(non_blocking=True)
    positions = (0, 7, 64, 511, 512, S - 2, S - 1) + ((1000, 8192, 32000) if S > 8192 else ())
    for pos in positions:
        a = _run("tiled", dev, pos, 0, counters, stream)
        b = _run("default", dev, pos, 0, counters, stream)
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-3 * np.abs(a).max(), err_msg=f"pos {pos}")
    pos_dev = cp.asarray([0], np.int64)
    with stream:
        stream.begin_capture()
        out = decode_attention.attention(*dev, pos_dev, 0.088, 0, counters, stream)
        graph = stream.end_capture()
    for pos in positions:
        pos_dev.set(np.array([pos], np.int64), stream=stream)
        graph.launch(stream)
        got = cp.asnumpy(out, stream=stream)
        stream.synchronize()
        want = decode_attention_reference(*host, pos, 0.088, 0)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max(),
                                   err_msg=f"graph pos {pos}")
    assert not cp.asnumpy(counters).any()


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "llama-Q8_0.gguf"
    synth("llama", "tiny", "Q8_0", str(path), seed=5)
    return str(path)


@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_decode_steps_match_cpu_over_many_splits(llama_file, kv):
    """A 300-token prompt in a 2048-position cache: 32 splits in the grid, 5 of them used."""
    ids = [int(i) for i in np.random.default_rng(1).integers(5, 400, 300)]
    cpu = Engine(llama_file, device="cpu", max_context=2048, kv=kv, prefill_chunk=128)
    gpu = Engine(llama_file, device="cuda", max_context=2048, kv=kv, prefill_chunk=128)
    cpu.prefill(ids)
    gpu.prefill(ids)
    tok = 7
    for _ in range(4):                        # the first step captures the graph, the rest replay
        lc, lg = cpu.decode_step(tok), gpu.decode_step(tok)
        rtol = 1e-2 if kv == "f16" else 2e-2
        np.testing.assert_allclose(lg, lc, rtol=rtol, atol=rtol * np.abs(lc).max())
        tok = int(np.argmax(lc))


@pytest.fixture(scope="module")
def qk_norm_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth_qk")
    files = {}
    for arch, quant in (("qwen3", "Q8_0"), ("qwen3moe", "Q4_K")):
        files[arch] = str(d / f"{arch}-{quant}.gguf")
        synth(arch, "tiny", quant, files[arch], seed=7)
    return files


@pytest.mark.parametrize("arch", ["qwen3", "qwen3moe"])
@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_folded_qk_norm_decode(qk_norm_files, arch, kv, monkeypatch):
    """BackendConfig.fold_qk_norm: the per-head q/k RMSNorm runs in rope_kv_store (cuda.py's
    rms_norm hands one decode token's (1, heads, head_dim) q or k to norm_later). Logits equal
    (within fp32 rounding) those of the separate rms_norm launches (off) and the CPU backend's; the prompt's last
    chunk is one token (folded too), the first decode step captures the graph, the rest replay."""
    from lite.backends.cuda_attention import CUDAAttention
    path = qk_norm_files[arch]
    ids = [int(i) for i in np.random.default_rng(2).integers(5, 500, 129)]
    folded = []
    real = CUDAAttention.norm_later

    def counted(self, x, name, eps):
        folded.append(name)
        return real(self, x, name, eps)
    monkeypatch.setattr(CUDAAttention, "norm_later", counted)
    engines = {"cpu": Engine(path, device="cpu", max_context=1024, kv=kv, prefill_chunk=128)}
    for fold in ("0", "1"):
        engines[fold] = Engine(path, device="cuda", max_context=1024, kv=kv, prefill_chunk=128,
                               config=BackendConfig(fold_qk_norm=fold == "1"))
    logits = {name: [e.prefill(ids)] for name, e in engines.items()}
    tok = 7
    for _ in range(4):
        for name, e in engines.items():
            logits[name].append(e.decode_step(tok))
        tok = int(np.argmax(logits["cpu"][-1]))
    assert folded, "rms_norm never called norm_later: cuda.py lacks the fold_qk_norm hook"
    rtol = 1e-2 if kv == "f16" else 2e-2
    for step, (c, off, on) in enumerate(zip(logits["cpu"], logits["0"], logits["1"])):
        diff = float(np.abs(on - off).max())     # expected 0: the same sums, in the same order
        np.testing.assert_allclose(on, off, rtol=1e-3, atol=1e-3 * np.abs(off).max(),
                                   err_msg=f"step {step}: folded vs separate, max diff {diff}")
        np.testing.assert_allclose(on, c, rtol=rtol, atol=rtol * np.abs(c).max(),
                                   err_msg=f"step {step}: folded vs CPU")
