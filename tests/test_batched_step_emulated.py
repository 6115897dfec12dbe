"""The server's GPU batched step without a GPU: the CUDA C of kernels/paged_attention.py compiled
with g++ against tests/cuda_c_emulator.py (through its real Python wrapper, a NumPy-backed `cupy`
standing in), against NumPy; then lite/engine/paged_cuda.py's CUDABatchOps driving those kernels inside
Stage.forward_batch on a synthetic llama, against the CPU's BatchOps step for step. Also the step
layout (positions, page slots, block tables) on its own, which needs no compiler.

The decode graphs (DecodeGraphs in lite/engine/paged_cuda.py), also without a GPU:

- The bucket of a step, and the padded layout a graph reads (positions, slots, lengths, tables).
- On tests/fake_cupy.py's FakeCupy (stream capture, graph replay): the real CUDABackend capture,
  replay and to_host, driven by the scheduler's step through the stage chain (Scheduler._forward), over toy
  stages whose one "kernel" turns every row's inputs and layout into numbers: graphed steps equal
  eager ones, one or two stages; a replayed step is one pinned host-to-device copy, the graph and
  the logits' copy; a capture that fails leaves its bucket eager (logged once).
- The real llama layers over CUDABatchOps with the paged-attention kernels emulated on the host
  (tests/cuda_c_emulator.py) and a host stand-in for graphs: graphed decode steps give the eager
  steps' logits and KV.
"""
import logging
import types

import numpy as np
import pytest

from cuda_c_emulator import available, emulated_kernels
from fake_cupy import FakeCupy, installed
from lite.backends.cpu import CPUBackend
from lite.errors import ContextOverflowError
from lite.engine.paged_cuda import (DecodeGraphs, DecodeLayout, StepLayout, bucket, buckets,
                             decode_step_host, graphable)
from lite.engine.paged_kv import BlockPool, PagedKV
from lite.chain.pipeline import StageChain
from lite.engine.scheduler import Scheduler
from lite.engine.stage import Stage, StageSpec
from test_decode_io import fake_backend

needs_gxx = pytest.mark.skipif(not available(), reason="needs g++ (C++20) to emulate CUDA C")
CFG = types.SimpleNamespace(n_head_kv=2, head_dim=64, v_head_dim=64, is_recurrent_layer=lambda il: False)
LENS = [1, 17, 33, 100]          # uneven: one key, past one block, past two, many blocks


@pytest.fixture(scope="module")
def pa():
    """kernels/paged_attention.py imported against a NumPy-backed `cupy` whose RawModule emulates
    (memory from empty() starts as NaN bytes, so a row no kernel wrote shows)."""
    with emulated_kernels("paged_attention") as mods:
        yield mods["paged_attention"]


def _tables(rng, lens, B, n_blocks):
    """Block tables drawn from a shuffled pool: every sequence's blocks out of order."""
    free = list(rng.permutation(n_blocks))
    return [[int(free.pop()) for _ in range(-(-L // B))] for L in lens]


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

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from lite.engine.engine import Engine
    from lite.files.synth import synth
    path = tmp_path_factory.mktemp("synth") / "llama-q8.gguf"
    synth("llama", "tiny", "Q8_0", str(path), seed=4)
    return Engine(str(path), device="cpu", max_context=160, contiguous_kv=False)


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


# --- the decode graphs ---------------------------------------------------------------------------
GRAPH_CFG = types.SimpleNamespace(n_head_kv=1, head_dim=4, v_head_dim=4, is_moe=False,
                            is_recurrent_layer=lambda il: False)


def test_buckets():
    assert buckets(16) == [1, 2, 4, 8, 16] and buckets(6) == [1, 2, 4, 6] and buckets(1) == [1]
    assert [bucket(n, 16) for n in (1, 2, 3, 5, 8, 9, 16)] == [1, 2, 4, 8, 8, 16, 16]
    assert bucket(5, 6) == 6
    with pytest.raises(ValueError):
        bucket(7, 6)


def test_padded_layout_holds_every_row_and_pads():
    """Three sequences in a bucket of four: ids, positions, page slots, query rows, lengths and
    tables (as wide as the context, each cut to the blocks its length needs); the pad row stores
    nothing (slot -1) and attends to one key over a zero table row."""
    pool = BlockPool(GRAPH_CFG, [0], 16, 4, "f16")
    lay = DecodeLayout(pool, 4, 21, np)                     # 21 positions: 6 blocks of 4
    assert lay.tables.shape == (4, 6) and lay.max_len == 24 and lay.n_single == 4 and not lay.chunks
    host = decode_step_host([7, 8, 9], [9, 0, 5], [[7, 2, 5, 3], [0], [4, 1]], 4, 4, 21)
    lay.upload(host)
    assert lay.ids.tolist() == [7, 8, 9, 0]
    assert lay.positions.tolist() == [9, 0, 5, 0]
    assert lay.slots.tolist() == [5 * 4 + 1, 0, 1 * 4 + 1, -1]
    assert lay.query_rows.tolist() == [0, 1, 2, 3] and lay.lens.tolist() == [10, 1, 6, 1]
    assert lay.tables.tolist() == [[7, 2, 5, 0, 0, 0], [0] * 6, [4, 1, 0, 0, 0, 0], [0] * 6]
    again = decode_step_host([3], [4], [[6, 2]], 4, 4, 21)  # one sequence: the rest is padding
    lay.upload(again)
    assert lay.slots.tolist() == [2 * 4, -1, -1, -1] and lay.lens.tolist() == [5, 1, 1, 1]
    assert lay.tables.tolist() == [[6, 2, 0, 0, 0, 0]] + [[0] * 6] * 3
    with pytest.raises(ValueError, match="cannot hold"):
        decode_step_host([1], [8], [[1, 2]], 4, 4, 21)
    with pytest.raises(ContextOverflowError):
        decode_step_host([1], [21], [[1] * 6], 4, 4, 21)
    with pytest.raises(ValueError, match="in a step of"):
        decode_step_host([1] * 5, [0] * 5, [[1]] * 5, 4, 4, 21)


def test_only_pure_decode_steps_on_cuda_stages_replay():
    st = object.__new__(Stage)
    st.spec, st.cfg, st.use_graphs = StageSpec(range(0, 2), True, True), GRAPH_CFG, True
    st.ops = types.SimpleNamespace(name="cuda", supports_graphs=True, graph_rows=lambda: 32)
    pools = [BlockPool(GRAPH_CFG, [0], 8, 4, "f16")]
    graphs = DecodeGraphs([st], pools, 4, 16)
    assert graphable(st) and graphs.step([1, 2], [0, 3], [1, 1], [[0], [1]]).size == 2
    assert graphs.step([1, 2, 3], [0, 3], [2, 1], [[0], [1]]) is None       # a prompt chunk
    assert DecodeGraphs([st], pools, 4, 16, enabled=False).step([1], [0], [1], [[0]]) is None
    st.cfg = types.SimpleNamespace(is_moe=False, is_recurrent_layer=lambda il: il == 1)
    assert not graphable(st)                                 # a hybrid's recurrent layers
    st.cfg, st.ops = GRAPH_CFG, types.SimpleNamespace(name="cpu")
    assert not graphable(st)


# --- FakeCupy: the real capture and replay over toy stages ----------------------------------------

V, H, B, CTX, SLOTS = 6, 3, 4, 40, 8


def _value(x, pos, slot, length, table):
    """A toy stage's output for one row: a number made of every input it reads."""
    return x + 7.0 * pos + 3.0 * slot + 11.0 * length + 5.0 * float(np.sum(table))


def toy_stage(fake, first, last, fail_capture=False, device_key="cuda:0"):
    st = object.__new__(Stage)
    st.spec, st.cfg, st.use_graphs = StageSpec(range(0, 1), first, last), GRAPH_CFG, True
    st.ops = be = fake_backend(fake, 0, graph_io=True)
    be.device_key, be.copy_stream = device_key, None

    def forward_rows(ops, x, kv=None, pos0=0, rows=None):
        if fail_capture and be.capturing:
            raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")
        lay = ops.layout()
        if first and not isinstance(x, fake.ndarray):
            x = fake.asarray(np.asarray(x, np.int32))          # as embed uploads host ids
        out = fake.empty((x.shape[0], V if last else H), np.float32)

        def fn():
            for j in range(lay.n_single):
                r, n = int(lay.query_rows[j]), int(lay.lens[j])
                xin = 1000.0 * float(x[r]) if first else 10.0 * float(x[r, 0])
                v = _value(xin, int(lay.positions[r]), int(lay.slots[r]), n, lay.tables[j, :-(-n // B)])
                out[r] = v + (np.arange(V) if last else 0)
        fake.kernel(be.stream, [x, lay.positions, lay.slots, lay.query_rows, lay.lens, lay.tables],
                    [out], fn)
        return out
    st.forward_rows = forward_rows
    return st


def _expected(seqs, n_stages):
    rows = []
    for s in seqs:
        p = s.n_computed
        args = (p, s.blocks[p // B] * B + p % B, p + 1, s.blocks[:p // B + 1])
        v = _value(1000.0 * s.tokens[p], *args)
        if n_stages == 2:
            v = _value(10.0 * v, *args)
        rows.append(v + np.arange(V))
    return np.asarray(rows, np.float32)


def _sequences(rng):
    free = [int(b) for b in rng.permutation(SLOTS * CTX // B)]
    return [types.SimpleNamespace(tokens=[int(t) for t in rng.integers(1, 9, CTX)], n_computed=int(n),
                                  blocks=[free.pop() for _ in range(CTX // B)], recurrent=None)
            for n in rng.integers(0, 20, SLOTS)]


def _scheduler(stages, graphs):
    pools = [BlockPool(GRAPH_CFG, [0], SLOTS * CTX // B, B, "f16") for _ in stages]
    engine = types.SimpleNamespace(stages=stages, chain=StageChain(stages, device_times=False))
    return types.SimpleNamespace(engine=engine, pools=pools, ctx=CTX,
                                 graphs=DecodeGraphs(stages, pools, SLOTS, CTX, enabled=graphs))


STEPS = [[0, 1, 2], [0, 1, 2, 3], [1], [4, 2], [0, 1, 2, 3, 4], [3], [5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7]]


@pytest.mark.parametrize("n_stages,devices", [(1, 1), (2, 1), (2, 2)])
def test_replayed_steps_equal_eager_steps(monkeypatch, n_stages, devices):
    """One stage; two on one device (the hidden states copied on the device); two on two
    "devices" (through the host, as the scheduler hands them over)."""
    fake = FakeCupy()
    with installed(monkeypatch, fake):
        runs = {}
        for graphs in (True, False):
            stages = [toy_stage(fake, i == 0, i == n_stages - 1, device_key=f"cuda:{i % devices}")
                      for i in range(n_stages)]
            sched, seqs = _scheduler(stages, graphs), _sequences(np.random.default_rng(3))
            outs = []
            for step in STEPS:
                plan = [(seqs[i], 1) for i in step]
                n_ops = len(fake.ops)
                outs.append(Scheduler._forward(sched, plan))
                ops = fake.ops[n_ops:]
                np.testing.assert_array_equal(outs[-1], _expected([s for s, _ in plan], n_stages))
                if graphs and devices == 1 and step in STEPS[5:]:      # buckets seen before
                    _check_replay(fake, ops, n_stages, len(step))
                for s, _ in plan:
                    s.n_computed += 1
            runs[graphs] = outs, sched.graphs
        for a, b in zip(runs[True][0], runs[False][0]):
            np.testing.assert_array_equal(a, b)
        graphs = runs[True][1]
        assert graphs.captures == 4 * n_stages                   # buckets 4, 1, 2 and 8
        assert graphs.replays == len(STEPS) * n_stages and runs[False][1].replays == 0
    if n_stages == 1:             # (two stages order their streams by a host wait, unseen here)
        assert fake.check_order() == []


def _check_replay(fake, ops, n_stages, n):
    """A replayed step: per stage one pinned host-to-device copy, then the graph; the logits'
    copy to the host last (through the pinned graph I/O for one row); nothing else on a stream."""
    whats = [op["what"] for op in ops]
    out = "memcpyAsync2" if n == 1 else "asnumpy"
    assert whats == ["set", "graph:kernel"] * n_stages + [out], whats
    for op in ops[::2][:n_stages]:
        (lo, hi), = op["reads"]
        assert fake.device_of(lo, hi - lo) is None            # host memory, pinned (registered)


def test_a_failed_capture_leaves_its_bucket_eager(monkeypatch, caplog):
    fake = FakeCupy()
    with installed(monkeypatch, fake), caplog.at_level(logging.WARNING, "lite.engine.paged_cuda"):
        stage = toy_stage(fake, True, True, fail_capture=True)
        sched, seqs = _scheduler([stage], True), _sequences(np.random.default_rng(4))
        for step in ([0, 1, 2], [0, 1, 2, 3], [2]):
            plan = [(seqs[i], 1) for i in step]
            n_ops = len(fake.ops)
            got = Scheduler._forward(sched, plan)
            np.testing.assert_array_equal(got, _expected([s for s, _ in plan], 1))
            if step == [0, 1, 2, 3]:                            # the bucket of 4 rows, eager now
                assert "asarray" in [op["what"] for op in fake.ops[n_ops:]]
            for s, _ in plan:
                s.n_computed += 1
    assert sched.graphs.replays == sched.graphs.captures == 0
    failed = [r for r in caplog.records if "could not be captured" in r.getMessage()]
    assert len(failed) == 2 and "NotImplementedError" in failed[0].getMessage()   # buckets 4, 1


# --- the llama layers over the emulated paged-attention kernels ----------------------------------

class _HostGraph:
    """A host stand-in for a CUDA graph: captured, fn runs once for its output buffer; each launch
    runs fn again into that same buffer, reading the same (persistent) inputs a graph reads."""

    def __init__(self, fn):
        self.fn, self.out = fn, fn()

    def launch(self):
        np.copyto(self.out, self.fn())


@needs_gxx
def test_graphed_llama_decode_steps_give_the_eager_logits(pa, tiny, monkeypatch):  # noqa: F811
    stage, cfg = tiny.stages[0], tiny.cfg
    for name, value in (("name", "cuda"), ("supports_graphs", True), ("replay", _HostGraph.launch),
                        ("graph_rows", lambda: 32), ("capture", lambda fn: (lambda g: (g, g.out))(_HostGraph(fn)))):
        monkeypatch.setattr(stage.ops, name, value, raising=False)
    monkeypatch.setattr(stage, "use_graphs", True)
    rng = np.random.default_rng(9)
    ctx, bs, n_blocks = tiny.max_context, 16, 60
    lengths = (5, 1, 19, 12, 3)
    tokens = [[int(t) for t in rng.integers(3, 400, n + 8)] for n in lengths]   # teacher-forced
    free = [int(b) for b in rng.permutation(n_blocks)]
    tables = [[free.pop() for _ in range(3)] for _ in lengths]
    runs = {}
    for graphs in (True, False):
        pools = [BlockPool(cfg, stage.spec.layers, n_blocks, bs, "f16")]
        sched = types.SimpleNamespace(engine=tiny, pools=pools, ctx=ctx,
                                      graphs=DecodeGraphs(tiny.stages, pools, 8, ctx, enabled=graphs))
        seqs = [types.SimpleNamespace(tokens=t, n_computed=0, blocks=b, recurrent=None)
                for t, b in zip(tokens, tables)]
        plans = [list(zip(seqs, lengths))]                     # the prompts: a mixed step, eager
        plans += [[(seqs[i], 1) for i in step]
                  for step in ([0, 1, 2], [0, 1, 2, 3], [1], [0, 2, 3, 4, 1], [4, 2], [0, 1, 2])]
        logits = []
        for plan in plans:
            # (a copy: the host backend's to_host hands back the graph's own output buffer)
            logits.append(Scheduler._forward(sched, plan).copy())
            for s, n in plan:
                s.n_computed += n
        runs[graphs] = logits, pools[0], sched.graphs
    (got, gpool, graphs), (want, wpool, _) = runs[True], runs[False]
    assert graphs.captures == 4 and graphs.replays == 6              # buckets 4, 1, 8 and 2
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())
    for il in wpool.k:
        for name in ("k", "v"):
            np.testing.assert_allclose(getattr(gpool, name)[il].astype(np.float32),
                                       getattr(wpool, name)[il].astype(np.float32), rtol=1e-3, atol=1e-3)
