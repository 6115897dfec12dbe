"""The one-pass prefill attention over the server's paged KV pool (kernels/flash_attention.py
paged_prefill, CUDA C kernels/cuda/flash_attention_paged.cu) compiled with g++ against
tests/cuda_c_emulator.py, through its real wrapper: the prompt chunks of a step, several sequences
in one launch, each through its own block table (blocks in shuffled order, a partial last block,
a cached prefix before the chunk), GQA, sliding windows, f16 and int8 pages. Held to a float64
attention over the pages' fp16 values, and to the contiguous kernel (flash_prefill) on the pool's
gathered copy (PagedKV.read, the copy the gather path makes) byte for byte: the same tile loop on
the same fp16 values. Skips without g++."""
import types

import numpy as np
import pytest

from cuda_c_emulator import available, emulated_kernels
from lite.paged_kv import BlockPool, PagedKV
from test_flash_attn import reference
from test_flash_attn_emulated import bound

pytestmark = pytest.mark.skipif(not available(), reason="needs g++ (C++20) to emulate CUDA C")


@pytest.fixture(scope="module")
def fa():
    with emulated_kernels("flash_attention", ascontiguousarray=np.ascontiguousarray) as mods:
        yield mods["flash_attention"]


def make_step(kind, D, H, Hkv, B, chunks, singles=1, seed=3):
    """A pool of one layer with random pages, and a step: the prompt chunks (T, pos0) of sequences
    whose blocks are drawn in shuffled order, with `singles` decode rows between them. Slots no
    chunk may read hold NaN (f16 values, or int8's scales), so a read past a sequence shows."""
    rng = np.random.default_rng(seed)
    need = [-(-(p + T) // B) for T, p in chunks]
    n_blocks = sum(need) + 3
    cfg = types.SimpleNamespace(n_head_kv=Hkv, head_dim=D, v_head_dim=D,
                                is_recurrent_layer=lambda il: False)
    pool = BlockPool(cfg, [0], n_blocks, B, kind)
    free = list(rng.permutation(n_blocks))
    tables = [[int(free.pop()) for _ in range(n)] for n in need]
    shape = pool.k[0].shape
    if kind == "f16":
        pool.k[0][...] = rng.standard_normal(shape) * 0.5
        pool.v[0][...] = rng.standard_normal(shape)
        hole = lambda blk, off: [a.__setitem__((blk, slice(None), off), np.nan) for a in (pool.k[0], pool.v[0])]
    else:
        pool.k[0][...] = rng.integers(-127, 128, shape)
        pool.v[0][...] = rng.integers(-127, 128, shape)
        pool.ks[0][...] = rng.random(shape[:3]) * 0.01
        pool.vs[0][...] = rng.random(shape[:3]) * 0.02
        hole = lambda blk, off: [a.__setitem__((blk, slice(None), off), np.nan) for a in (pool.ks[0], pool.vs[0])]
    for blk in free:
        hole(blk, slice(None))
    for (T, p), table in zip(chunks, tables):
        if (p + T) % B:
            hole(table[-1], slice((p + T) % B, None))
    rows, r = [], 0
    for T, _ in chunks:
        r += singles                     # decode rows of other sequences sit between the chunks
        rows.append(r)
        r += T
    q = rng.standard_normal((r, H, D)).astype(np.float32)
    width = max(need)
    tab = np.zeros((len(chunks), width), np.int32)
    for n, t in enumerate(tables):
        tab[n, :len(t)] = t
    meta = np.asarray([(r0, T, p) for r0, (T, p) in zip(rows, chunks)], np.int32)
    return pool, tables, q, meta, tab


def run(fa, kind, D, H, Hkv, B, chunks, window, singles=1, seed=3):
    pool, tables, q, meta, tab = make_step(kind, D, H, Hkv, B, chunks, singles, seed)
    scale = 1 / np.sqrt(D)
    ks, vs = (pool.ks[0], pool.vs[0]) if kind == "int8" else (None, None)
    out = np.full((q.shape[0], H * D), 7.0, np.float32)
    got = fa.paged_prefill(q, meta, tab, pool.k[0], pool.v[0], ks, vs, max(T for T, _ in chunks),
                           scale, window, None, out=out)
    assert got is out
    written = np.zeros(q.shape[0], bool)
    for (r0, T, p), table in zip(meta, tables):
        K, V = PagedKV(pool, table, 4096).read(0, p + T, np.float16)   # the gathered fp16 copy
        mine = got[r0:r0 + T].reshape(T, H, D)
        np.testing.assert_allclose(mine, reference(q[r0:r0 + T], K, V, p, window, scale),
                                   rtol=0, atol=bound(V))
        contiguous = fa.flash_prefill(q[r0:r0 + T], K, V, int(p), window, scale, None)
        np.testing.assert_array_equal(mine, contiguous)
        written[r0:r0 + T] = True
    assert (got[~written] == 7.0).all()              # the decode rows between: untouched


# (kind, D, H, Hkv, B, chunks (T, pos0), window): several sequences of unequal chunks (rows past a
# tile's end, a chunk shorter than a tile, one after a cached prefix, one from position 0), partial
# last blocks, a block size that is no power of two, windows that start in the prefix and in the chunk
CASES = [
    ("f16", 64, 4, 2, 16, [(70, 50), (5, 0), (33, 17)], 0),
    ("int8", 64, 4, 2, 12, [(40, 29), (17, 3)], 30),
    ("f16", 128, 4, 1, 16, [(45, 100), (20, 7)], 45),
    ("int8", 128, 2, 2, 32, [(30, 70)], 0),
    ("f16", 256, 2, 1, 16, [(20, 37), (9, 0)], 24),
    ("int8", 256, 4, 2, 8, [(40, 11)], 0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "{}-D{}-H{}/{}-B{}-{}-win{}".format(
    c[0], c[1], c[2], c[3], c[4], "+".join(f"{T}@{p}" for T, p in c[5]), c[6]))
def test_paged_kernel_matches_float64_and_the_contiguous_kernel(fa, case):
    run(fa, *case)


def test_chunks_back_to_back(fa):
    """No rows between the chunks: each chunk's rows and no other's, GQA of 4 heads a KV head."""
    run(fa, "f16", 64, 8, 2, 16, [(17, 16), (16, 0)], 0, singles=0, seed=9)


def test_refuses_what_it_cannot_take(fa):
    pool, _, q, meta, tab = make_step("f16", 64, 2, 1, 16, [(4, 0)])
    with pytest.raises(ValueError, match="D = Dv"):
        fa.paged_prefill(q[..., :48].copy(), meta, tab, pool.k[0][..., :48].copy(),
                         pool.v[0][..., :48].copy(), None, None, 4, 0.1, 0, None)
    with pytest.raises(ValueError, match="int8 pages"):
        fa.paged_prefill(q, meta, tab, pool.k[0], pool.v[0], pool.k[0], pool.v[0], 4, 0.1, 0, None)
