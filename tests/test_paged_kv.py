"""The server's paged KV cache and prefix-cache blocks, and its stop strings: pure, no model."""
from types import SimpleNamespace

import numpy as np
import pytest

from lite.kv_cache import KVCache
from lite.paged_kv import BlockManager, BlockPool, PagedKV, block_hashes
from lite.server.stop_text import StopMatcher

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
