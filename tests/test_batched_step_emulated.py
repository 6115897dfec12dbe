"""The server's GPU batched step without a GPU: the CUDA C of kernels/paged_attention.py compiled
with g++ against tests/cuda_c_emulator.py (through its real Python wrapper, a NumPy-backed `cupy`
standing in), against NumPy; then lite/engine/paged_cuda.py's CUDABatchOps driving those kernels inside
Stage.forward_batch on a synthetic llama, against the CPU's BatchOps step for step. Also the step
layout (positions, page slots, block tables) on its own, which needs no compiler. The decode graphs
over the same step are in tests/test_decode_graphs_emulated.py.
"""
import types

import numpy as np
import pytest

from cuda_c_emulator import emulated_kernels
from lite.backends.cpu import CPUBackend
from lite.engine.paged_cuda import StepLayout
from lite.engine.paged_kv import BlockPool, PagedKV
from paged_emulated import _tables, needs_gxx, pa, tiny  # noqa: F401 (pa, tiny: fixtures)

CFG = types.SimpleNamespace(n_head_kv=2, head_dim=64, v_head_dim=64, is_recurrent_layer=lambda il: False)
LENS = [1, 17, 33, 100]          # uneven: one key, past one block, past two, many blocks


def _pool(rng, kind, n_blocks, Hkv, B, D, Dv):
    if kind == "f16":      # every slot filled, so a key past a sequence's length would show
        return (rng.standard_normal((n_blocks, Hkv, B, D)).astype(np.float16),
                rng.standard_normal((n_blocks, Hkv, B, Dv)).astype(np.float16), None, None)
    return (rng.integers(-127, 128, (n_blocks, Hkv, B, D)).astype(np.int8),
            rng.integers(-127, 128, (n_blocks, Hkv, B, Dv)).astype(np.int8),
            (rng.random((n_blocks, Hkv, B)) * 0.02).astype(np.float32),
            (rng.random((n_blocks, Hkv, B)) * 0.02).astype(np.float32))


@needs_gxx
@pytest.mark.parametrize("kind", ["f16", "int8"])
@pytest.mark.parametrize("H,Hkv,D,Dv,window,splits", [
    (8, 2, 64, 64, 0, None),       # G = 4: one block column a KV head, one split
    (8, 2, 64, 64, 0, 3),          # the splits merged by the second launch
    (8, 2, 64, 64, 0, 7),          # more splits than a short sequence has keys: empty ones
    (12, 2, 64, 64, 20, None),     # G = 6: a column of 4 heads and one of 2; sliding window
    (12, 2, 64, 64, 20, 3),
    (4, 4, 128, 128, 0, 2),        # no GQA, the 8B head dim
    (4, 2, 96, 32, 0, None),       # unequal head dims, not multiples of 32
])
def test_paged_attention_matches_reference(pa, kind, H, Hkv, D, Dv, window, splits):
    rng = np.random.default_rng(1)
    B, n_blocks, R = 16, 24, 6
    tables = _tables(rng, LENS, B, n_blocks)
    width = max(map(len, tables))
    tab = np.zeros((len(LENS), width), np.int32)
    for n, t in enumerate(tables):
        tab[n, :len(t)] = t
    K, V, ks, vs = _pool(rng, kind, n_blocks, Hkv, B, D, Dv)
    q = rng.standard_normal((R, H, D)).astype(np.float32)
    rows = np.array([4, 0, 5, 2], np.int32)          # the sequences' query rows, out of order
    lens = np.array(LENS, np.int32)
    out = pa.attention(q, rows, lens, tab, K, V, ks, vs, 0.125, window, None, splits=splits)
    want = pa.attention_reference(q, rows, lens, tab, K, V, ks, vs, 0.125, window)
    for r, w in want.items():
        np.testing.assert_allclose(out[r], w, rtol=2e-4, atol=2e-4 * np.abs(w).max(), err_msg=f"row {r}")
    assert np.isnan(out[[1, 3]]).all()                # rows of no sequence are left alone
    # the reference tells the tables and lengths apart, so a kernel that mixed them up would fail
    unused = sorted(set(range(n_blocks)) - set(tab.ravel().tolist()))
    other_block = tab.copy()
    other_block[2, 1] = unused[0]
    other = pa.attention_reference(q, rows, lens, other_block, K, V, ks, vs, 0.125, window)
    assert not np.allclose(other[int(rows[2])], want[int(rows[2])], atol=1e-3)
    longer = pa.attention_reference(q, rows, lens + 1, tab, K, V, ks, vs, 0.125, window)
    assert not np.allclose(longer[int(rows[1])], want[int(rows[1])], atol=1e-3)


@needs_gxx
@pytest.mark.parametrize("kind", ["f16", "int8"])
@pytest.mark.parametrize("neox,n_rot", [(True, 64), (False, 32)])
def test_rope_store_matches_cpu_rope_and_paged_write(pa, kind, neox, n_rot):
    """Every row rotated at its own position and stored at its page slot, as the CPU's rope and
    PagedKV.write do it; a padding row (slot -1) stores nothing."""
    rng = np.random.default_rng(2)
    H, Hkv, D, B, n_blocks = 4, 2, 64, 16, 16
    starts, counts = [0, 37, 99, 5], [5, 1, 1, 1]           # a prompt chunk, then lone rows
    tables = _tables(rng, [s + c for s, c in zip(starts, counts)], B, n_blocks - 1)
    R = sum(counts) + 1                                     # and one padding row at the end
    q = rng.standard_normal((R, H, D)).astype(np.float32)
    k, v = (rng.standard_normal((R, Hkv, D)).astype(np.float32) for _ in range(2))
    rows = np.cumsum([0] + counts)
    pos = np.concatenate([np.arange(s, s + c) for s, c in zip(starts, counts)] + [[0]]).astype(np.int32)
    slots = np.concatenate([np.asarray(t)[p // B] * B + p % B for t, p in
                            zip(tables, np.split(pos[:-1], rows[1:-1]))] + [[-1]]).astype(np.int32)
    gpu, cpu = (BlockPool(CFG, [0], n_blocks, B, kind) for _ in range(2))
    rope = (n_rot, 10000.0, 1.0, neox)
    q_out = pa.rope_store(q, k, v, gpu.k[0], gpu.v[0], getattr(gpu, "ks", {0: None})[0],
                          getattr(gpu, "vs", {0: None})[0], pos, slots, rope, None)
    for i, (s, c) in enumerate(zip(starts, counts)):
        r = slice(rows[i], rows[i + 1])
        want_q = CPUBackend.rope(None, q[r], s, 10000.0, neox, n_rot, 1.0)
        np.testing.assert_allclose(q_out[r], want_q, rtol=1e-5, atol=1e-5)
        PagedKV(cpu, tables[i], 256).write(0, CPUBackend.rope(None, k[r], s, 10000.0, neox, n_rot, 1.0),
                                           v[r], s)
    assert np.isnan(q_out[-1]).sum() == 0                   # q of a padding row is still rotated
    for name in ("k", "v") + (("ks", "vs") if kind == "int8" else ()):
        got, want = getattr(gpu, name)[0], getattr(cpu, name)[0]
        if kind == "int8" and name in ("k", "v"):            # one rounding step apart at most
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, name
        else:
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                       rtol=1e-3, atol=1e-3, err_msg=name)
    assert not gpu.k[0][n_blocks - 1].any()                 # the block no table holds: untouched


def test_step_layout_places_every_row():
    """Positions and page slots of every row; the lone rows' lengths and zero-padded tables; the
    prompt chunks left for the prefill path."""
    pool = BlockPool(CFG, [0], 12, 4, "f16")
    starts, tables = [9, 0, 3, 6], [[7, 2, 5], [0, 11], [4], [9, 1]]
    kvs = [PagedKV(pool, t, 64) for t in tables]
    rows = [0, 1, 7, 8, 10]                                 # 1, 6, 1 and 2 rows
    lay = StepLayout(starts, rows, kvs, np)
    assert lay.positions.tolist() == [9, 0, 1, 2, 3, 4, 5, 3, 6, 7]
    assert lay.slots.tolist() == [5 * 4 + 1, 0, 1, 2, 3, 44, 45, 4 * 4 + 3, 1 * 4 + 2, 1 * 4 + 3]
    assert lay.query_rows.tolist() == [0, 7] and lay.lens.tolist() == [10, 4]
    assert lay.tables.tolist() == [[7, 2, 5], [4, 0, 0]] and lay.max_len == 10
    assert lay.chunks == [(1, 1, 7), (3, 8, 10)]
    with pytest.raises(ValueError, match="cannot hold"):
        StepLayout([8], [0, 1], [PagedKV(pool, [1, 2], 64)], np)


# --- CUDABatchOps inside Stage.forward_batch, the kernels emulated, against the CPU's BatchOps ---

@needs_gxx
@pytest.mark.parametrize("kind", ["f16", "int8"])
def test_cuda_batch_ops_step_for_step_as_the_cpu(pa, tiny, kind, monkeypatch):
    """Steps as the scheduler makes them: prompt chunks beside decoding rows, a prompt's lone last
    token, one sequence alone; block tables out of order. The CUDA path (rope-store, paged
    attention, gathered prefill) gives the CPU path's logits, and both pools the same KV."""
    stage, cfg = tiny.stages[0], tiny.cfg
    rng = np.random.default_rng(5)
    B, n_blocks = 16, 40
    pools = {which: BlockPool(cfg, stage.spec.layers, n_blocks, B, kind) for which in ("cpu", "cuda")}
    prompts = [list(rng.integers(3, 400, n)) for n in (12, 1, 21, 17)]
    tables = _tables(rng, [len(p) + 8 for p in prompts], B, n_blocks)
    tokens, done = [list(p) for p in prompts], [0] * len(prompts)
    # (sequence, rows) a step: all of prompt 0, 1, 2 at once; then decode 0..2 and prompt 3 in two
    # chunks; then all decode; then sequence 1 alone
    plans = [[(0, 12), (1, 1), (2, 21)], [(0, 1), (1, 1), (2, 1), (3, 9)], [(3, 8), (0, 1), (2, 1)],
             [(0, 1), (1, 1), (2, 1), (3, 1)], [(1, 1)]]
    for plan in plans:
        ids = np.asarray([t for i, n in plan for t in tokens[i][done[i]:done[i] + n]], np.int32)
        starts, counts = [done[i] for i, _ in plan], [n for _, n in plan]
        got = {}
        for which in ("cpu", "cuda"):
            kvs = [PagedKV(pools[which], tables[i], 160) for i, _ in plan]
            with monkeypatch.context() as m:
                m.setattr(stage.ops, "name", which)
                got[which] = stage.forward_batch(ids, starts, counts, kvs)
        want = got["cpu"]
        assert want.shape == (len(plan), cfg.n_vocab)
        np.testing.assert_allclose(got["cuda"], want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
        for i, n in plan:
            done[i] += n
            if done[i] == len(tokens[i]):
                tokens[i].append(int(np.argmax(want[[j for j, (s, _) in enumerate(plan) if s == i][0]])))
    for il in pools["cpu"].k:
        for name in ("k", "v"):
            a, b = (getattr(pools[w], name)[il] for w in ("cpu", "cuda"))
            if kind == "int8":
                assert np.abs(a.astype(int) - b.astype(int)).max() <= 1
            else:
                np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=2e-3, atol=2e-3)


@needs_gxx
@pytest.mark.parametrize("kind", ["f16", "int8"])
def test_one_row_step_takes_the_backends_deferred_qk_norms(pa, kind):
    """A step of one row on the CUDA backend: q and k come from rms_norm as NormLater (qwen3's
    per-head norms left for the attention launch, lite/backends/cuda_attention.py); CUDABatchOps
    norms them (the backend's rms_norm kernel, emulated) before its rope-store launch, and attends
    as the CPU does over the same pages."""
    from lite.backend_config import BackendConfig
    from lite.backends.cuda_attention import CUDAAttention, NormLater
    from lite.engine.paged_cuda import CUDABatchOps
    small_ops = _emulated_small_ops()
    rng = np.random.default_rng(6)
    H, Hkv, D, B, pos, eps = 4, 2, 64, 16, 40, 1e-6
    table = [5, 1, 7]
    pools = [BlockPool(CFG, [0], 8, B, kind) for _ in range(2)]
    past = rng.standard_normal((2, pos, Hkv, D)).astype(np.float32)
    for pool in pools:
        PagedKV(pool, table, 64).write(0, past[0], past[1], 0)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    k, v = rng.standard_normal((2, 1, Hkv, D)).astype(np.float32)
    w = {n: (rng.random(D) + 0.5).astype(np.float32) for n in ("qn", "kn")}
    from lite.backends.ops import Ops
    gpu = type("AttentionOnly", (CUDAAttention, Ops), {})()     # the backend's attention part, as an Ops
    gpu.cp = gpu.xp = np
    gpu.small_ops, gpu.stream, gpu.config = small_ops, None, BackendConfig()
    gpu.w = {n: types.SimpleNamespace(data=a) for n, a in w.items()}
    q_in, k_in = gpu.norm_later(q, "qn", eps), gpu.norm_later(k, "kn", eps)
    assert isinstance(q_in, NormLater) and isinstance(k_in, NormLater)
    ops = CUDABatchOps(gpu, [pos], [1], [PagedKV(pools[0], table, 64)], kernels=pa)
    rope = (10000.0, True, D, 1.0)
    got = ops.attention(None, 0, ops.rope(q_in, pos, *rope), ops.rope(k_in, pos, *rope), v, pos, 0.125)
    with pytest.raises(TypeError):
        ops.rope(q, pos, *rope).reshape(1, -1)       # only attention takes the rotation
    cpu = types.SimpleNamespace(w=w)
    qn, kn = CPUBackend.rms_norm(cpu, q, "qn", eps), CPUBackend.rms_norm(cpu, k, "kn", eps)
    bare = CPUBackend.__new__(CPUBackend)        # the CPU's attention on no weights
    want = CPUBackend.attention(bare, PagedKV(pools[1], table, 64), 0,
                                CPUBackend.rope(None, qn, pos, *rope),
                                CPUBackend.rope(None, kn, pos, *rope), v, pos, 0.125)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def _emulated_small_ops():
    """kernels/small_ops.py against the emulating `cupy` (its rms_norm kernel); the package's own
    module is back once it is imported, so that nothing else sees it."""
    with emulated_kernels("small_ops") as mods:
        return mods["small_ops"]


def test_the_gpu_scheduler_keeps_f16_or_int8_kv():
    """The batched step's kernels store f16 or int8 pages: --kv f32 on the GPU is refused up front."""
    from lite.errors import LiteError
    from lite.engine.scheduler import Scheduler
    with pytest.raises(LiteError, match="f16 or int8"):
        Scheduler(types.SimpleNamespace(device="cuda", kv_kind="f32"))
    with pytest.raises(LiteError, match="CPU or a CUDA GPU"):
        Scheduler(types.SimpleNamespace(device="tpu", kv_kind="f16"))
