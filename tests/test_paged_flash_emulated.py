"""The one-pass prefill attention over the server's paged KV pool (kernels/flash_attention.py
paged_prefill, CUDA C kernels/cuda/flash_attention_paged.cu) compiled with g++ against
tests/cuda_c_emulator.py, through its real wrapper: the prompt chunks of a step, several sequences
in one launch, each through its own block table (blocks in shuffled order, a partial last block,
a cached prefix before the chunk), GQA, sliding windows, f16 and int8 pages. Held to a float64
attention over the pages' fp16 values, and to the contiguous kernel (flash_prefill) on the pool's
gathered copy (PagedKV.read, the copy the gather path makes) byte for byte: the same tile loop on
the same fp16 values. Then lite/engine/paged_cuda.py's CUDABatchOps inside Stage.forward_batch on a
synthetic llama: steps whose prompt chunks go through the paged kernel give, byte for byte, the
logits and pages of the same steps through the gather path with the contiguous kernel. Skips
without g++."""
import types

import numpy as np
import pytest

from cuda_c_emulator import available, emulated_kernels
from lite.engine.paged_kv import BlockPool, PagedKV
from paged_emulated import _tables, tiny  # noqa: F401 (tiny: a fixture)
from test_flash_attn import reference
from test_flash_attn_emulated import bound

pytestmark = pytest.mark.skipif(not available(), reason="needs g++ (C++20) to emulate CUDA C")


@pytest.fixture(scope="module")
def emulated():
    """kernels/flash_attention.py and paged_attention.py against a NumPy `cupy` whose RawModule
    emulates (lite.kernels' own modules are these while the tests of this file run)."""
    with emulated_kernels("flash_attention", "paged_attention",
                          ascontiguousarray=np.ascontiguousarray) as mods:
        yield mods


@pytest.fixture(scope="module")
def fa(emulated):
    return emulated["flash_attention"]


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
        nan_at = (pool.k[0], pool.v[0])
    else:
        pool.k[0][...] = rng.integers(-127, 128, shape)
        pool.v[0][...] = rng.integers(-127, 128, shape)
        pool.ks[0][...] = rng.random(shape[:3]) * 0.01
        pool.vs[0][...] = rng.random(shape[:3]) * 0.02
        nan_at = (pool.ks[0], pool.vs[0])

    def hole(blk, off):
        for a in nan_at:
            a[blk, :, off] = np.nan
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


def run(fa, kind, D, H, Hkv, B, chunks, window, singles=1, seed=3, gpu=None):
    """The step's chunks through paged_prefill against float64 and the contiguous kernel on each
    chunk's gathered copy. gpu: (cupy, stream) to run there, where the two kernels are compiled
    apart, so the same arithmetic is held to a bound rather than to the bytes; None: the emulator."""
    pool, tables, q, meta, tab = make_step(kind, D, H, Hkv, B, chunks, singles, seed)
    dev, host, stream = ((gpu[0].asarray, gpu[0].asnumpy, gpu[1]) if gpu else
                         (np.asarray, np.asarray, None))
    scale = 1 / np.sqrt(D)
    ks, vs = (dev(pool.ks[0]), dev(pool.vs[0])) if kind == "int8" else (None, None)
    out = dev(np.full((q.shape[0], H * D), 7.0, np.float32))
    got = fa.paged_prefill(dev(q), dev(meta), dev(tab), dev(pool.k[0]), dev(pool.v[0]), ks, vs,
                           max(T for T, _ in chunks), scale, window, stream, out=out)
    assert got is out
    got = host(got)
    written = np.zeros(q.shape[0], bool)
    for (r0, T, p), table in zip(meta, tables):
        K, V = PagedKV(pool, table, 4096).read(0, p + T, np.float16)   # the gathered fp16 copy
        mine = got[r0:r0 + T].reshape(T, H, D)
        np.testing.assert_allclose(mine, reference(q[r0:r0 + T], K, V, p, window, scale),
                                   rtol=0, atol=bound(V))
        contiguous = host(fa.flash_prefill(dev(q[r0:r0 + T]), dev(K), dev(V), int(p), window,
                                           scale, stream))
        if gpu:
            np.testing.assert_allclose(mine, contiguous, rtol=0, atol=1e-5 * np.abs(V).max())
        else:
            np.testing.assert_array_equal(mine, contiguous)
        written[r0:r0 + T] = True
    assert (got[~written] == 7.0).all()              # the decode rows between: untouched


# (kind, D, H, Hkv, B, chunks (T, pos0), window): several sequences of unequal chunks (rows past a
# tile's end, a chunk shorter than a tile, one after a cached prefix, one from position 0), partial
# last blocks, a block size that is no power of two, windows that start in the prefix and in the chunk
CASES = [
    ("f16", 64, 4, 2, 16, [(70, 50), (5, 0), (33, 17)], 0),
    ("int8", 64, 4, 2, 12, [(40, 29), (17, 3)], 30),
    ("f16", 128, 2, 1, 16, [(45, 100), (20, 7)], 45),
    ("int8", 128, 2, 2, 32, [(30, 70)], 0),
    ("f16", 256, 2, 1, 16, [(20, 37), (9, 0)], 24),
    ("int8", 256, 4, 2, 8, [(40, 11)], 0),
]


def case_id(c):
    return "{}-D{}-H{}/{}-B{}-{}-win{}".format(*c[:5], "+".join(f"{T}@{p}" for T, p in c[5]), c[6])


@pytest.mark.parametrize("case", CASES, ids=case_id)
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


def test_step_through_the_paged_kernel_is_the_gather_paths(emulated, tiny, monkeypatch):
    """Steps as the scheduler makes them (prompt chunks of several sequences beside decode rows, a
    prompt in two chunks, block tables out of order) on CUDABatchOps over the CPU backend, whose
    attend (the gather path's attention) is the emulated contiguous kernel: with paged_flash_takes
    the chunks go through one paged launch a layer and give the same logits and pages, bytes
    and all, as through the gather path. int8 pages (the scales handed through too); f16 pages
    differ only in passing none, which the kernel tests above cover."""
    kind = "int8"
    fa = emulated["flash_attention"]
    stage, cfg = tiny.stages[0], tiny.cfg
    rng = np.random.default_rng(7)
    B, n_blocks = 16, 40
    paths = ("gathered", "paged")
    pools = {p: BlockPool(cfg, stage.spec.layers, n_blocks, B, kind) for p in paths}
    prompts = [list(rng.integers(3, 400, n)) for n in (12, 1, 21, 17)]
    tables = _tables(rng, [len(p) + 4 for p in prompts], B, n_blocks)
    plans = [[(0, 12), (1, 1), (2, 9)], [(2, 12), (0, 1), (3, 17)]]
    tokens = [p + [5, 6] for p in prompts]        # the decode rows' tokens: any will do here
    done = [0] * len(prompts)
    inner = stage.ops.row_invariant             # the ops CUDABatchOps wraps (BatchOps takes this view)
    for plan in plans:
        ids = np.asarray([t for i, n in plan for t in tokens[i][done[i]:done[i] + n]], np.int32)
        starts, counts = [done[i] for i, _ in plan], [n for _, n in plan]
        got, calls = {}, []
        for path in paths:
            kvs = [PagedKV(pools[path], tables[i], 160) for i, _ in plan]
            with monkeypatch.context() as m:
                m.setattr(stage.ops, "name", "cuda")
                m.setattr(inner, "attend", lambda q, K, V, pos0, scale, window=0: calls.append(
                    "contiguous") or fa.flash_prefill(q, K, V, pos0, window, scale, None).reshape(
                    q.shape[0], -1), raising=False)
                paged = fa.paged_prefill
                m.setattr(fa, "paged_prefill", lambda *a, **k: calls.append("paged") or paged(*a, **k))
                m.setattr(inner, "paged_flash_takes", lambda D, Dv, p=path: p == "paged",
                          raising=False)
                got[path] = stage.forward_batch(ids, starts, counts, kvs)
        assert np.isfinite(got["gathered"]).all()
        chunks, layers = sum(n > 1 for _, n in plan), cfg.n_layer
        assert calls == ["contiguous"] * chunks * layers + ["paged"] * layers
        np.testing.assert_array_equal(got["paged"], got["gathered"])
        for i, n in plan:
            done[i] += n
    for il in pools["paged"].k:
        for name in ("k", "v") + (("ks", "vs") if kind == "int8" else ()):
            np.testing.assert_array_equal(*(getattr(pools[p], name)[il] for p in paths))
