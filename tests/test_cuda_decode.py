"""Decode-step attention on the GPU (kernels/cupy_decode.py): the kernels at the 8B model's head
shape against NumPy, and whole decode steps against the CPU backend at contexts that span several
splits (runs on the GPU machine; skips elsewhere)."""
import numpy as np
import pytest

from lite.backends import cuda_unavailable_reason
from lite.engine import Engine
from lite.synth import synth
from test_cupy_kernels_emulated import decode_attention_reference

WHY = cuda_unavailable_reason()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"needs a GPU: {WHY}")


@pytest.mark.parametrize("kind", ["f16", "int8"])
@pytest.mark.parametrize("window", [0, 700])
def test_attn_decode_8b_shape(kind, window):
    import cupy as cp
    from lite.kernels import cupy_decode
    rng = np.random.default_rng(0)
    H, Hkv, D, S = 32, 8, 128, 8448
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
    dev = [None if a is None else cp.asarray(a) for a in (q, K, V, ks, vs)]
    counters = cupy_decode.new_counters()
    stream = cp.cuda.Stream(non_blocking=True)
    for pos in (0, 100, 511, 4000, 8447):
        out = cupy_decode.attn_decode(*dev, cp.asarray([pos], np.int64), 0.088, window, counters,
                                      stream)
        got = cp.asnumpy(out, stream=stream)
        stream.synchronize()
        want = decode_attention_reference(q, K, V, ks, vs, pos, 0.088, window)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
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
