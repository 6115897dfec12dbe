"""Pinned graph input/output of a decode step (BackendConfig.graph_io, on by default;
lite/backends/cuda_graph_io.py).

On the CPU: the real CUDABackend methods (persistent_input, set_input, begin, capture, replay,
to_host) and the real Stage/StageChain decode path run against the fake CuPy of
tests/fake_cupy.py, which records stream operations, captures graphs and replays their nodes. A
toy forward stands in for the layers: logits = 1000 * token + position + column (one stage), or a
hidden state 1000 * token + position that the last stage turns into 10 * hidden + position +
column (two stages). On a GPU: greedy decode with graph_io on equals graph_io off byte for byte
(skips here)."""
import gc
import types

import numpy as np
import pytest

from fake_cupy import FakeCupy, installed
from lite.backend_config import BackendConfig
from lite.backends import cuda_graph_io
from lite.backends.cuda import CUDABackend
from lite.backends.cuda_graph_io import DecodeIO, LeasePool
from lite.chain.pipeline import ChunkJob, StageChain
from lite.engine.stage import Stage, StageSpec, as_ids

V, H = 48, 8


class _KV:
    max_context = 1 << 20

    def check_fits(self, n):
        pass


def fake_backend(fake, device_id, graph_io):
    """A CUDABackend without weights: the attributes its decode-step methods use."""
    be = object.__new__(CUDABackend)
    be.cp = be.xp = fake
    be.device = fake.cuda.Device(device_id)
    with be.device:
        be.stream = fake.cuda.Stream(non_blocking=True)
        be.graph_io = (DecodeIO(fake, types.SimpleNamespace(empty_pinned=fake.empty_pinned),
                                be.stream) if graph_io else None)
        be.pos_dev = be.graph_io.pos_dev if graph_io else fake.zeros(1, np.int64)
        be._pos_host = fake.empty_pinned(1, np.int64)
    be.capturing = False
    be._graph_memory = []
    be.w, be.config = {}, BackendConfig()
    return be


def toy_stage(fake, device_id, first, last, graph_io):
    st = object.__new__(Stage)
    st.spec = StageSpec(range(0, 1), first, last)
    st.ops, st.kv, st.all_logits, st.use_graphs, st._graph = (
        fake_backend(fake, device_id, graph_io), _KV(), False, True, None)
    ops = st.ops

    def forward(ops_, x, kv, pos0, rows=None):
        ops.begin(pos0, x.shape[0])
        pos = ops.pos_dev
        out = fake.empty((1, V if last else H), np.float32)

        def fn():
            v = float(x[0]) * 1000 if first else float(x[0, 0]) * 10
            out[0, :] = v + float(pos[0]) + (np.arange(out.shape[1]) if last else 0)
        fake.kernel(ops.stream, [x, pos], [out], fn)
        return out
    st.forward_rows = forward
    return st


def expected(tokens, positions, n_stages):
    rows = []
    for t, p in zip(tokens, positions):
        h = 1000.0 * t + p
        v = h if n_stages == 1 else 10.0 * h + p
        rows.append((v + np.arange(V)).astype(np.float32))
    return rows


def decode(chain, tokens, pos0):
    outs = []
    for i, t in enumerate(tokens):
        job = ChunkJob.decode_step(1, pos0 + i, as_ids([t]))
        outs.append(chain.decode(job.input, job))
    return outs


def step_ops(fake, fn):
    n = len(fake.ops)
    out = fn()
    return out, fake.ops[n:]


@pytest.mark.parametrize("graph_io", [True, False])
def test_one_stage_decode_values(monkeypatch, graph_io):
    fake = FakeCupy()
    with installed(monkeypatch, fake):
        st = toy_stage(fake, 0, True, True, graph_io)
        chain = StageChain([st], device_times=False)
        tokens = [5, 9, 2, 7, 7, 1, 3]
        outs = decode(chain, tokens, 10)
    for got, want in zip(outs, expected(tokens, range(10, 17), 1)):
        np.testing.assert_array_equal(got[-1], want)
    assert fake.check_order() == []


def test_graph_io_step_is_one_pinned_copy_in_and_logits_into_pinned_memory(monkeypatch):
    fake = FakeCupy()
    with installed(monkeypatch, fake):
        st = toy_stage(fake, 0, True, True, True)
        chain = StageChain([st], device_times=False)
        decode(chain, [4], 0)                          # capture
        io = st.ops.graph_io
        kept = []
        for i, t in enumerate([8, 6, 3]):
            job = ChunkJob.decode_step(1, 1 + i, as_ids([t]))
            y, ops = step_ops(fake, lambda: chain.decode(job.input, job))
            kept.append(y)
            h2d = [op for op in ops if "HostToDevice" in op["what"] or op["what"].endswith("1")]
            # ONE copy in, a node of the graph, 16 bytes ([token, position]) from pinned memory
            assert [op["what"] for op in h2d] == ["graph:memcpyAsync1"], [o["what"] for o in ops]
            (lo, hi), = h2d[0]["reads"]
            assert hi - lo == 16 and (lo, hi) == (io.host_in.ctypes.data, io.host_in.ctypes.data + 16)
            assert fake.device_of(lo, 16) is None                 # host memory the fake pinned
            assert not [op for op in ops if op["what"] in ("set", "asarray", "asnumpy")]
            # logits: one device -> pinned host copy, after the graph, and the returned array IS
            # that pinned memory (no staging, no host copy)
            d2h = [op for op in ops if op["what"] == "memcpyAsync2"]
            assert len(d2h) == 1 and ops.index(d2h[0]) == len(ops) - 1
            (wlo, whi), = d2h[0]["writes"]
            assert y.ctypes.data == wlo and y.nbytes == whi - wlo
            assert fake.device_of(y.ctypes.data, y.nbytes) is None
            assert all(op["what"].startswith("graph:") for op in ops[:-1])
        syncs = [c for c in fake.calls if c[0] == "synchronize"]
        assert len(syncs) >= 3
    for got, want in zip(kept, expected([8, 6, 3], [1, 2, 3], 1)):
        np.testing.assert_array_equal(got[-1], want)   # not overwritten by the later steps
    assert fake.check_order() == []


def test_returned_logits_survive_later_steps_and_the_pool_recycles(monkeypatch):
    fake = FakeCupy()
    tokens = list(range(1, 15))
    with installed(monkeypatch, fake):
        st = toy_stage(fake, 0, True, True, True)
        chain = StageChain([st], device_times=False)
        pool = st.ops.graph_io.pool
        held = decode(chain, tokens, 0)                 # the caller keeps every step's logits
        rows = [h[-1] for h in held]                    # and views of them
        assert pool.held == pool.size                   # the pool is exhausted: later steps copied
        assert st.ops.graph_io.copied_steps == len(tokens) - pool.size
        for got, want in zip(rows, expected(tokens, range(len(tokens)), 1)):
            np.testing.assert_array_equal(got, want)
        del held, rows, got
        gc.collect()
        assert pool.held == 0                           # dropped: back in the pool
        copied = st.ops.graph_io.copied_steps
        last = None
        for i, t in enumerate([3, 4, 5, 6, 7, 8]):      # generate's pattern: keep the last one
            last = decode(chain, [t], 100 + i)[0]
            np.testing.assert_array_equal(last[-1], expected([t], [100 + i], 1)[0])
        assert st.ops.graph_io.copied_steps == copied   # no copies while buffers come back
        assert pool.held <= 2


def test_lease_pool_frees_only_when_every_view_is_gone():
    pool = LeasePool(lambda shape, dtype: np.zeros(shape, dtype), 2)
    s = pool.take((1, 4), np.float32)
    a = pool.lease(s)
    a[...] = 3
    views = [a[-1], a[:, 1:], np.asarray(a), a.view(), a.T, a.reshape(-1)]
    del a
    gc.collect()
    assert pool.free == [] and pool.held == 1
    while views:
        views.pop()
        gc.collect()
        assert (pool.free == [s]) == (not views)
    assert pool.take((1, 4), np.float32) == s


def test_two_stage_chain_with_graph_io(monkeypatch):
    """A non-last stage takes the token from pinned memory and hands its hidden state on as before;
    only the last stage returns logits; values equal the plain path's."""
    got = {}
    for graph_io in (False, True):
        fake = FakeCupy()
        with installed(monkeypatch, fake):
            stages = [toy_stage(fake, 0, True, False, graph_io),
                      toy_stage(fake, 1, False, True, graph_io)]
            for st in stages:                       # asynchronous hand-off, ordered by events
                st.ops.configure_handoff("p2p")
            chain = StageChain(stages, device_times=False)
            tokens = [5, 9, 2, 7, 1]
            got[graph_io] = [o.copy() for o in decode(chain, tokens, 3)]
            if graph_io:
                assert stages[0].ops.graph_io._done is not None    # waited on before the next write
                job = ChunkJob.decode_step(1, 8, as_ids([4]))
                _, ops = step_ops(fake, lambda: chain.decode(job.input, job))
                assert [op["what"] for op in ops if op["what"].endswith("memcpyAsync1")] == \
                    ["graph:memcpyAsync1", "graph:memcpyAsync1"]   # one per stage
            chain.close()
        assert fake.check_order() == []
        for g, w in zip(got[graph_io], expected(tokens, range(3, 8), 2)):
            np.testing.assert_array_equal(g[-1], w)
    assert all(np.array_equal(a, b) for a, b in zip(got[False], got[True]))


def test_flag_is_on_by_default():
    assert BackendConfig().graph_io
    assert not BackendConfig().with_settings("graph_io=off").graph_io


def test_decode_job_equals_the_dataclass():
    ids = as_ids([3])
    a = ChunkJob(2, 7, 7, 8, ids, last=True, decode=True)
    b = ChunkJob.decode_step(2, 7, ids)
    assert a == b and b.n_tokens == 1 and b.input is ids
    with pytest.raises(Exception):
        b.start = 3                                     # still frozen


# --- on a GPU -------------------------------------------------------------------------------------
def _gpu_why():
    from lite.backends import cuda_unavailable_reason
    return cuda_unavailable_reason()


@pytest.mark.skipif(_gpu_why() is not None, reason="needs a GPU")
@pytest.mark.parametrize("arch,quant,split", [("llama", "Q8_0", None), ("qwen3moe", "Q4_K", None),
                                              ("llama", "Q8_0", 2)])
def test_gpu_graph_io_identical(tmp_path, arch, quant, split):
    from lite.engine.engine import Engine
    from lite.engine.sampling import Sampler, SamplingParams
    from lite.files.synth import synth
    path = str(tmp_path / f"{arch}.gguf")
    synth(arch, "tiny", quant, path, seed=3)
    greedy = Sampler(SamplingParams.greedy())
    ids = list(range(5, 40))
    runs = {}
    for flag in ("0", "1"):
        e = Engine(path, device="cuda", max_context=128, layer_split=split,
                   config=BackendConfig(graph_io=flag == "1"))
        assert (e.stages[-1].ops.graph_io is not None) == (flag == "1")
        logits, toks = [e.prefill(ids)], []
        for _ in range(24):
            toks.append(greedy(logits[-1]))
            logits.append(e.decode_step(toks[-1]))
        runs[flag] = (toks, logits, list(e.generate(ids + [3], 12, greedy, stop_at_eog=False)))
    assert runs["0"][0] == runs["1"][0]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(runs["0"][1], runs["1"][1]))
    assert runs["0"][2] == runs["1"][2]


class _Cycle:
    """Cyclic garbage whose finalizer notes whether a capture was in progress when it ran."""

    def __init__(self, seen, inside):
        self.me, self.seen, self.inside = self, seen, inside

    def __del__(self):
        self.seen.append(self.inside[0])


def test_no_garbage_collection_while_a_graph_is_captured():
    """cuda_graph_io.no_collection (CUDABackend.capture): garbage pending before a capture is
    collected before it, none during it (a finalizer calling CUDA would invalidate the capture),
    with two stages' captures overlapping in two threads; collection is back after the last."""
    import gc
    import threading
    seen, inside = [], [False]
    old = gc.get_threshold()
    gc.set_threshold(1)          # any allocation may start a collection
    try:
        assert gc.isenabled()
        _Cycle(seen, inside)
        entered, release = threading.Event(), threading.Event()

        def other_stage():
            with cuda_graph_io.no_collection():
                entered.set()
                release.wait(5)

        t = threading.Thread(target=other_stage)
        with cuda_graph_io.no_collection():
            inside[0] = True
            t.start()
            entered.wait(5)
            for _ in range(200):
                _Cycle(seen, inside)
            inside[0] = False
        assert not gc.isenabled()    # the other stage still captures
        release.set()
        t.join(5)
        assert gc.isenabled()
        gc.collect()
    finally:
        gc.set_threshold(*old)
    assert seen[0] is False and len(seen) == 201 and not any(seen), seen[:5]


def test_one_chunk_prefill_waits_once_and_copies_back_one_row(monkeypatch):
    """Engine.prefill of a 512-token prompt in one chunk on one GPU stage (what `lite bench -p 512`
    times): the ids go up once, and the host waits once, for the one row of logits it reads back
    (into pinned memory); nothing else crosses to the host. The toy forward stands in for the
    layers (their ops enqueue and never wait: lite/backends/cuda*.py)."""
    from lite.engine.engine import Engine
    fake = FakeCupy()
    with installed(monkeypatch, fake):
        st = toy_stage(fake, 0, True, True, True)
        ops = st.ops

        def forward(ops_, x, kv=None, pos0=0, rows=None):   # embed's upload, then the last row's logits
            ops.begin(pos0, x.shape[0])
            ids = fake.asarray(np.asarray(x, dtype=np.int64))
            out = fake.empty((1, V), np.float32)
            last = pos0 + x.shape[0] - 1

            def fn():
                out[0, :] = float(ids[-1]) * 1000 + last + np.arange(V)
            fake.kernel(ops.stream, [ids], [out], fn)
            return out
        st.forward_rows = forward
        st.kv.recurrent = types.SimpleNamespace(after_chunk=lambda end, last: None)
        eng = object.__new__(Engine)
        eng.stages, eng.chain = [st], StageChain([st], device_times=False)
        eng.cfg, eng.chunk, eng.profile = types.SimpleNamespace(is_hybrid=False), 512, None
        eng.cached_ids, eng.n_requests = [], 0
        prompt = [int(t) for t in np.random.default_rng(0).integers(1, 40, 512)]
        n_ops, n_calls = len(fake.ops), len(fake.calls)
        logits = eng.prefill(prompt)
        ops_run, calls = fake.ops[n_ops:], fake.calls[n_calls:]
    np.testing.assert_array_equal(logits, expected([prompt[-1]], [511], 1)[0])
    assert [c[0] for c in calls] == ["synchronize"]
    assert [op["what"] for op in ops_run] == ["asarray", "kernel", "memcpyAsync2"]
    (lo, hi), = ops_run[-1]["writes"]
    assert hi - lo == V * 4 and fake.device_of(lo, V * 4) is None     # one row, into pinned memory
    assert fake.check_order() == []
