"""KV caches, pure, no model: the contiguous cache (f32 exact, f16 and int8 (scale per token and
head) within their rounding, overflow) and the server's paged KV cache and prefix-cache blocks,
and its stop strings."""
from types import SimpleNamespace

import numpy as np
import pytest

from lite.files.config import ModelConfig
from lite.errors import ContextOverflowError
from lite.engine.kv_cache import KVCache, kv_bytes_per_token
from lite.engine.paged_kv import BlockManager, BlockPool, PagedKV, block_hashes
from lite.engine.sampling import StopMatcher


def cfg():
    md = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
          "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
          "llama.vocab_size": 100}
    return ModelConfig.from_gguf(md)


@pytest.mark.parametrize("kind,tol", [("f32", 0.0), ("f16", 1e-3), ("int8", 1.0 / 127)])
def test_write_read_round_trip(kind, tol):
    c = cfg()
    kv = KVCache(c, range(2), 32, kind)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((5, 2, 16)).astype(np.float32)
    v = rng.standard_normal((5, 2, 16)).astype(np.float32)
    kv.write(1, k, v, 3)
    K, V = kv.read(1, 8)
    assert K.shape == (2, 8, 16) and V.dtype == np.float32
    got_k = K[:, 3:8].transpose(1, 0, 2)
    # relative to each (token, head) row's largest value, as int8's scale is
    scale = np.abs(k).max(axis=-1, keepdims=True)
    assert np.all(np.abs(got_k - k) <= tol * scale + 1e-7)
    assert np.all(K[:, :3] == 0)


def test_int8_zero_rows_stay_zero():
    kv = KVCache(cfg(), [0], 8, "int8")
    z = np.zeros((2, 2, 16), np.float32)
    kv.write(0, z, z, 0)
    K, V = kv.read(0, 2)
    assert np.all(K == 0) and np.all(V == 0)


def test_overflow_is_a_clear_error():
    kv = KVCache(cfg(), [0], 4, "f16")
    x = np.zeros((3, 2, 16), np.float32)
    kv.write(0, x, x, 0)
    with pytest.raises(ContextOverflowError, match="context of 4"):
        kv.write(0, x, x, 2)


def test_bytes_per_token():
    c = cfg()
    assert kv_bytes_per_token(c, 2, "f16") == 2 * 2 * (16 + 16) * 2
    assert kv_bytes_per_token(c, 2, "int8") < kv_bytes_per_token(c, 2, "f16")


# --- the server's paged KV cache (lite/engine/paged_kv.py) ---

CFG = SimpleNamespace(n_head_kv=2, head_dim=8, v_head_dim=8, is_recurrent_layer=lambda il: False)


@pytest.mark.parametrize("kind", ["f32", "f16", "int8"])
def test_paged_reads_what_the_contiguous_cache_reads(kind):
    rng = np.random.default_rng(0)
    pool = BlockPool(CFG, [0], n_blocks=8, block_size=4, kind=kind)
    paged, flat = PagedKV(pool, [5, 2, 7], 12), KVCache(CFG, [0], 12, kind)
    for pos0, T in ((0, 3), (3, 5), (8, 1), (9, 3)):       # chunks across block edges, then steps
        k, v = (rng.standard_normal((T, 2, 8)).astype(np.float32) for _ in range(2))
        paged.write(0, k, v, pos0)
        flat.write(0, k, v, pos0)
        for got, want in zip(paged.read(0, pos0 + T), flat.read(0, pos0 + T)):
            np.testing.assert_array_equal(got, want)


def test_prefix_blocks_are_shared_then_reused_least_recent_first():
    bm = BlockManager(4, block_size=2)
    keys = block_hashes([1, 2, 3, 4, 5], 2)
    assert len(keys) == 2 and block_hashes([1, 2, 3, 9], 2)[0] == keys[0]
    a = [bm.allocate(), bm.allocate()]
    for b, k in zip(a, keys):
        bm.register(b, k)
    assert bm.match(keys) == a and bm.refs[a[0]] == 2          # a second sequence shares them
    bm.release(a)
    bm.release(a)
    assert bm.n_free == 4 and bm.n_cached == 2                  # free, and still cached
    assert bm.match(keys[:1]) == a[:1]
    fresh = [bm.allocate(), bm.allocate(), bm.allocate()]       # 2 never keyed, then the idle one
    assert fresh[2] == a[1] and bm.match(keys[1:]) == [] and bm.n_cached == 1
    bm.release(fresh + a[:1])
    assert bm.n_free == 4


def test_stop_split_across_pieces_never_leaks():
    m = StopMatcher(["<|end|>", "\n\n"])
    out = []
    for piece in ["Hello", " wor", "ld<|", "en", "d|> more"]:
        text, stopped = m.push(piece)
        out.append(text)
        if stopped:
            break
    assert "".join(out) == "Hello world" and m.stopped == "<|end|>"
    m = StopMatcher(["STOP"])
    assert m.push("a ST") == ("a ", False) and m.push("ar") == ("STar", False)
    assert m.push("x S") == ("x ", False) and m.flush() == "S"


def test_f32_cache_refused_on_the_gpu(monkeypatch, tmp_path):
    """The GPU's decode kernels read f16 or int8 caches: --kv f32 there is one clear error, not a cache
    read with the wrong element type."""
    import lite.engine.engine
    from lite.errors import LiteError
    from lite.files.synth import synth
    path = tmp_path / "tiny.gguf"
    synth("llama", "tiny", "Q8_0", str(path))
    monkeypatch.setattr(lite.engine.engine, "resolve_backend", lambda device: ("cuda", object))
    with pytest.raises(LiteError, match="--kv f32 runs on the CPU only"):
        lite.engine.engine.Engine(str(path), device="cuda", kv="f32")
