"""KV cache: f32 exact, f16 and int8 (scale per token and head) within their rounding, overflow."""
import numpy as np
import pytest

from lite.config import ModelConfig
from lite.errors import ContextOverflowError
from lite.kv_cache import KVCache, kv_bytes_per_token


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
