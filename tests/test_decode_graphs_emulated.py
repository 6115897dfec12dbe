"""The decode graphs (DecodeGraphs in lite/engine/paged_cuda.py) without a GPU:

- The bucket of a step, and the padded layout a graph reads (positions, slots, lengths, tables).
- On tests/fake_cupy.py's FakeCupy (stream capture, graph replay): the real CUDABackend capture,
  replay and to_host, driven by the scheduler's step through the stage chain (Scheduler._forward), over toy
  stages whose one "kernel" turns every row's inputs and layout into numbers: graphed steps equal
  eager ones, one or two stages; a replayed step is one pinned host-to-device copy, the graph and
  the logits' copy; a capture that fails leaves its bucket eager (logged once).
- The real llama layers over CUDABatchOps with the paged-attention kernels emulated on the host
  (tests/cuda_c_emulator.py) and a host stand-in for graphs: graphed decode steps give the eager
  steps' logits and KV.

The batched step these graphs replay is tested in tests/test_batched_step_emulated.py.
"""
import logging
import types

import numpy as np
import pytest

from fake_cupy import FakeCupy, installed
from lite.chain.pipeline import StageChain
from lite.engine.paged_cuda import DecodeGraphs, DecodeLayout, bucket, buckets, decode_step_host, graphable
from lite.engine.paged_kv import BlockPool
from lite.engine.scheduler import Scheduler
from lite.engine.stage import Stage, StageSpec
from lite.errors import ContextOverflowError
from paged_emulated import needs_gxx, pa, tiny  # noqa: F401 (pa, tiny: fixtures)
from test_decode_io import fake_backend

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
