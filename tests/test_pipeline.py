"""The stage chain on the CPU: overlap and makespan with sleeping stages, byte-identical outputs
for any stage count, errors that name their stage and chunk, hand-off buffer reuse."""
import threading
import time

import numpy as np
import pytest

from lite.errors import LiteError
from lite.chain.pipeline import ChunkJob, HostHandoff, StageChain, StageError, make_jobs
from lite.chain.timeline import Timeline

D = 16          # hidden size of the toy model
VOCAB = 32
N_LAYERS = 12


# --- toy model: deterministic numpy layers with per-stage state, split any way -------------------

def _weights():
    rng = np.random.default_rng(1234)
    emb = rng.standard_normal((VOCAB, D)).astype(np.float32)
    layers = [(rng.standard_normal((D, D)).astype(np.float32) / np.sqrt(D),
               rng.standard_normal(D).astype(np.float32) * 0.1) for _ in range(N_LAYERS)]
    out = rng.standard_normal((D, VOCAB)).astype(np.float32)
    return emb, layers, out


class LayerStage(HostHandoff):
    """Layers [lo, hi) of the toy model. Each layer mixes in the running sum of its inputs over
    all earlier positions (a stand-in for a KV cache), so chunks must arrive in order."""

    def __init__(self, weights, lo, hi, first, last):
        self.emb, layers, self.out = weights
        self.layers = list(range(lo, hi))
        self.W = {i: layers[i] for i in self.layers}
        self.first, self.last = first, last
        self.reset()

    def reset(self):
        self.carry = {i: np.zeros(D, np.float32) for i in self.layers}   # (D,) sum over positions

    def run(self, job, x):
        if self.first:
            x = self.emb[np.asarray(x)]                                   # (T, D)
        for i in self.layers:
            W, b = self.W[i]
            prefix = self.carry[i] + np.cumsum(x, axis=0, dtype=np.float32)  # (T, D)
            self.carry[i] = prefix[-1].copy()
            n = np.arange(job.start + 1, job.end + 1, dtype=np.float32)[:, None]
            x = np.tanh((x + prefix / n) @ W + b).astype(np.float32)
        return x @ self.out if self.last else x


def toy_chain(n_stages, **kw):
    w = _weights()
    cuts = np.linspace(0, N_LAYERS, n_stages + 1).round().astype(int)
    stages = [LayerStage(w, cuts[i], cuts[i + 1], i == 0, i == n_stages - 1)
              for i in range(n_stages)]
    return StageChain(stages, **kw)


def plain_loop(ids, chunk):
    stage = LayerStage(_weights(), 0, N_LAYERS, True, True)
    return [stage.run(job, job.input) for job in make_jobs(ids, chunk)]


IDS = np.random.default_rng(7).integers(0, VOCAB, 203).astype(np.int32)


@pytest.mark.parametrize("mode", ["chain", "sync"])
def test_outputs_byte_identical_for_any_stage_count(mode):
    ref = plain_loop(IDS, 32)
    assert len(ref) == 7 and ref[-1].shape == (203 - 6 * 32, VOCAB)
    for s in (1, 2, 3, 4):
        with toy_chain(s, mode=mode) as chain:
            outs = chain.prefill(IDS, 32)
        assert len(outs) == len(ref)
        for a, b in zip(outs, ref):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{s} stages differ"


def test_handoff_depth_two_same_bytes():
    ref = plain_loop(IDS, 16)
    with toy_chain(3, handoff_depth=2) as chain:
        outs = chain.prefill(IDS, 16)
        assert all(len(st.slots) == 3 for st in chain._stages)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(outs, ref))


def test_one_stage_is_a_plain_loop_on_the_callers_thread():
    seen = []

    class Probe(HostHandoff):
        def run(self, job, x):
            seen.append((threading.get_ident(), job.index))
            return x   # the same object must come back: no copies

        def to_handoff(self, y, buf):
            raise AssertionError("one stage never hands off")

    inputs = [np.arange(4) + i for i in range(3)]
    jobs = [ChunkJob(0, i, 4 * i, 4 * i + 4, x) for i, x in enumerate(inputs)]
    with StageChain([Probe()]) as chain:
        outs = chain.run(jobs)
        assert all(st.pool is None for st in chain._stages)
    assert all(o is x for o, x in zip(outs, inputs))
    assert seen == [(threading.get_ident(), i) for i in range(3)]


def test_decode_matches_prefill_of_the_same_tokens():
    ids = IDS[:40]
    ref = plain_loop(ids, 8)
    with toy_chain(3) as chain:
        chain.prefill(ids[:32], 8)
        steps = [chain.decode(ids[t:t + 1], ChunkJob(0, t, t, t + 1, decode=True))
                 for t in range(32, 40)]
    # positions 32..39 were a single chunk in the reference: compare row by row
    np.testing.assert_allclose(np.concatenate(steps), ref[-1], rtol=1e-5, atol=1e-6)


# --- buffer reuse: a successor reads its hand-off buffer late, after a sleep ----------------------

class LateReader(HostHandoff):
    def __init__(self, delay):
        self.delay = delay

    def run(self, job, x):
        time.sleep(self.delay)          # the predecessor runs ahead meanwhile
        return np.array(x) + 1          # reads buf only now


def test_handoff_buffers_not_overwritten_while_in_use():
    jobs = [ChunkJob(0, i, i, i + 1, np.full((3, 2), float(i), np.float32)) for i in range(8)]
    for depth in (1, 2):
        with StageChain([LateReader(0.0), LateReader(0.01), LateReader(0.02)],
                        handoff_depth=depth) as chain:
            outs = chain.run(jobs)
        assert [float(o[0, 0]) for o in outs] == [i + 3.0 for i in range(8)]


# --- timing: overlap and makespan --------------------------------------------------------------

class Sleeper(HostHandoff):
    def __init__(self, t):
        self.t = t

    def run(self, job, x):
        time.sleep(self.t)              # releases the GIL, like a GPU stage waiting on its stream
        return np.asarray(x, np.float32).reshape(-1, 1)


def _sleep_run(n_stages, n_chunks, t, mode):
    jobs = [ChunkJob(0, i, 4 * i, 4 * i + 4, np.zeros(4, np.float32)) for i in range(n_chunks)]
    with StageChain([Sleeper(t) for _ in range(n_stages)], mode=mode) as chain:
        chain.run(jobs[:1])                       # start the worker threads outside the timing
        t0 = time.perf_counter()
        chain.run(jobs)
        return time.perf_counter() - t0, chain.timeline


T_CHUNK = 0.04


def test_chunks_overlap_across_stages_like_the_diagram():
    S, n = 4, 5
    _, tl = _sleep_run(S, n, T_CHUNK, "chain")
    ev = {(e.stage, e.chunk): e for e in tl.events}
    assert len(ev) == S * n
    for k in range(S - 1):
        for c in range(n - 1):
            # stage k starts chunk c+1 before stage k+1 finishes chunk c
            assert ev[k, c + 1].start < ev[k + 1, c].end
            # and each stage keeps its own chunks in order, one at a time
            assert ev[k, c].end <= ev[k, c + 1].start
    rows = tl.rows(width=90)
    assert [r.split(":")[0] for r in rows] == [f"stage{k}" for k in range(S)]
    assert [r.index("[C0") for r in rows] == sorted(r.index("[C0") for r in rows)
    assert rows[0].index("[C0") < rows[-1].index("[C0")


@pytest.mark.parametrize("S,n", [(2, 4), (4, 5)])
def test_makespan_is_n_plus_s_minus_one_chunk_times(S, n):
    # Best of three: a loaded CI machine only adds delay, never removes it, so the fastest run is
    # the one that shows what the chain itself does. The 10% bound is the acceptance criterion.
    best, chunk_t = float("inf"), T_CHUNK
    for _ in range(3):
        total, tl = _sleep_run(S, n, T_CHUNK, "chain")
        # "one chunk's time" as measured (a sleep on a loaded machine overshoots a little)
        chunk_t = float(np.median([e.duration for e in tl.events]))
        if total < best:
            best, best_chunk = total, chunk_t
        if abs(best - (n + S - 1) * best_chunk) <= 0.1 * (n + S - 1) * best_chunk:
            break
    ideal = (n + S - 1) * best_chunk
    assert abs(best - ideal) <= 0.1 * ideal, (best, ideal)
    assert best_chunk == pytest.approx(T_CHUNK, rel=0.25)

    total, tl = _sleep_run(S, n, T_CHUNK, "sync")
    assert total > 1.1 * ideal                       # not the pipelined makespan
    assert total >= 0.95 * n * S * T_CHUNK           # ~ n x S: nothing overlaps


# --- errors -------------------------------------------------------------------------------------

class Boom(RuntimeError):
    pass


class Failing(HostHandoff):
    def __init__(self, stage, fail_at, t=0.005):
        self.stage, self.fail_at, self.t = stage, fail_at, t

    def run(self, job, x):
        time.sleep(self.t)
        if (job.request_id, job.index) == self.fail_at:
            raise Boom(f"bad chunk on stage {self.stage}")
        return np.asarray(x, np.float32).reshape(-1, 1) + 1


def _call_with_timeout(fn, timeout=10.0):
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:   # noqa: BLE001 - handed back to the test
            box["error"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), "the chain hung"
    return box


@pytest.mark.parametrize("mode", ["chain", "sync"])
@pytest.mark.parametrize("S,k,c", [(4, 2, 3), (3, 0, 0), (3, 2, 5), (1, 0, 2)])
def test_error_names_stage_and_chunk_and_chain_recovers(mode, S, k, c):
    stages = [Failing(i, (1, c) if i == k else None) for i in range(S)]
    chain = StageChain(stages, mode=mode)
    jobs = lambda rid: [ChunkJob(rid, i, i, i + 1, np.zeros(2, np.float32)) for i in range(6)]
    box = _call_with_timeout(lambda: chain.run(jobs(1)))
    err = box.get("error")
    assert isinstance(err, StageError) and isinstance(err, LiteError)
    assert f"stage {k}" in str(err) and f"chunk {c}" in str(err) and "Boom" in str(err)
    assert (err.stage, err.chunk, err.request_id) == (k, c, 1)
    assert isinstance(err.__cause__, Boom)
    # the next request runs to the end with the right values
    box = _call_with_timeout(lambda: chain.run(jobs(2)))
    assert "error" not in box
    assert [float(o[0, 0]) for o in box["value"]] == [float(S)] * 6
    _call_with_timeout(chain.close)
    assert all(st.pool is None or st.pool._shutdown for st in chain._stages)


def test_error_in_handoff_names_the_stage_that_failed():
    class BadCopy(Failing):
        def to_handoff(self, y, buf):
            raise ValueError("copy failed")

    stages = [Failing(0, None), BadCopy(1, None), Failing(2, None)]
    with StageChain(stages) as chain:
        box = _call_with_timeout(lambda: chain.run(
            [ChunkJob(0, i, i, i + 1, np.zeros(2, np.float32)) for i in range(3)]))
    err = box["error"]
    assert isinstance(err, StageError) and err.stage == 1 and err.chunk == 0
    assert isinstance(err.__cause__, ValueError)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(LiteError, match="mode"):
        StageChain([Sleeper(0)], mode="async")
    with pytest.raises(LiteError, match="depth"):
        StageChain([Sleeper(0)], handoff_depth=0)
    with pytest.raises(LiteError, match="StageRunner"):
        StageChain([object()])
    with pytest.raises(LiteError, match="at least one"):
        StageChain([])
    chain = StageChain([Sleeper(0)])
    chain.close()
    with pytest.raises(LiteError, match="closed"):
        chain.prefill(np.zeros(3), 2)


def test_make_jobs_positions():
    jobs = make_jobs(np.arange(10), 4, request_id=3, start=100)
    assert [(j.start, j.end, j.last) for j in jobs] == [(100, 104, False), (104, 108, False),
                                                        (108, 110, True)]
    assert [list(j.input) for j in jobs] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(LiteError):
        make_jobs([], 4)


def test_timeline_trace(tmp_path):
    _, tl = _sleep_run(3, 3, 0.005, "chain")
    assert isinstance(tl, Timeline)
    trace = tl.to_chrome_trace(tmp_path / "t.json")
    import json
    loaded = json.loads((tmp_path / "t.json").read_text())
    assert loaded == trace
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 9 and {e["tid"] for e in xs} == {0, 1, 2}
    assert all(e["dur"] > 0 and e["ts"] >= 0 for e in xs)
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    assert names == {0: "stage0", 1: "stage1", 2: "stage2"}


def test_decode_error_is_a_stage_error_and_chain_recovers():
    stages = [Failing(0, None, 0), Failing(1, (5, 9), 0)]
    with StageChain(stages) as chain:
        with pytest.raises(StageError, match="stage 1 failed on decode step") as info:
            chain.decode(np.zeros(1, np.float32), ChunkJob(5, 9, 9, 10, decode=True))
        assert isinstance(info.value.__cause__, Boom)
        out = chain.prefill(np.zeros(4, np.float32), 2)
    assert [o.ravel().tolist() for o in out] == [[2.0, 2.0], [2.0, 2.0]]


def test_timeline_summary_from_known_events():
    tl = Timeline()
    for s in range(2):
        for c in range(3):
            tl.record(s, c, 1.0 + s + c, 2.0 + s + c)
    assert tl.makespan() == pytest.approx(4.0)
    assert tl.busy(0) == pytest.approx(3.0)
    summ = tl.summary()
    assert summ[1]["chunks"] == 3 and summ[1]["utilization"] == pytest.approx(0.75)
    rows = tl.rows(width=40)
    assert rows == ["stage0: [C0------][C1------][C2------]",
                    "stage1:           [C0------][C1------][C2------]"]


# --- host and device time per stage-chunk -------------------------------------------------------

class FakeClock:
    """A device clock whose marks are counters; elapsed() notes when it is read."""

    def __init__(self, per_chunk, log):
        self.per_chunk, self.log, self.n = per_chunk, log, 0

    def mark(self):
        self.n += 1
        return self.n

    def elapsed(self, a, b):
        self.log.append(("read", time.perf_counter()))
        assert b == a + 1
        return self.per_chunk


class Timed(Sleeper):
    def __init__(self, t, device_s=None, log=None):
        super().__init__(t)
        self.device_s, self.log = device_s, log

    def run(self, job, x):
        y = super().run(job, x)
        self.log.append(("ran", time.perf_counter()))
        return y

    def device_timer(self):
        return FakeClock(self.device_s, self.log) if self.device_s is not None else None


@pytest.mark.parametrize("S", [1, 3])
def test_events_carry_host_and_device_time_read_after_the_drain(S):
    log = []
    stages = [Timed(0.01, device_s=0.5 + k if k != 1 else None, log=log) for k in range(S)]
    jobs = [ChunkJob(0, i, 4 * i, 4 * i + 4, np.zeros(4, np.float32)) for i in range(4)]
    with StageChain(stages) as chain:
        chain.run(jobs)
        evs = chain.timeline.events
    assert len(evs) == 4 * S
    last_run = max(t for what, t in log if what == "ran")
    reads = [t for what, t in log if what == "read"]
    assert len(reads) == 4 * (S - 1 if S > 1 else 1) and min(reads) > last_run
    for e in evs:
        assert 0.009 < e.host <= e.duration and 0 <= e.host_cpu <= e.host
        # stage 1 has no device clock (a CPU stage): its device time is its host time
        assert e.device == (e.host if e.stage == 1 else 0.5 + e.stage)
    summ = chain.timeline.summary()
    assert summ[0]["device_s"] == pytest.approx(4 * 0.5)
    assert summ[0]["host_s"] == pytest.approx(sum(e.host for e in evs if e.stage == 0))


def test_unreadable_device_clock_leaves_none_and_the_prefill_succeeds(caplog):
    class Broken(FakeClock):
        def elapsed(self, a, b):
            raise RuntimeError("event lost")

    class R(Sleeper):
        def device_timer(self):
            return Broken(0, [])

    with StageChain([R(0), R(0)]) as chain:
        outs = chain.run([ChunkJob(0, i, i, i + 1, np.zeros(2, np.float32)) for i in range(2)])
        assert len(outs) == 2
        assert all(e.device is None and e.host is not None for e in chain.timeline.events)
    assert "device time unreadable" in caplog.text


def test_device_timer_discovery():
    from lite.chain.pipeline import device_timer

    class Ops:
        stream = None

    class R(HostHandoff):
        ops = Ops()

        def run(self, job, x):
            return x
    assert device_timer(R()) is None and device_timer(Sleeper(0)) is None
    assert isinstance(device_timer(Timed(0, 1.0, [])), FakeClock)
    with StageChain([Timed(0, 1.0, [])], device_times=False) as chain:
        chain.run([ChunkJob(0, 0, 0, 1, np.zeros(1))])
        (e,) = chain.timeline.events
        assert e.device == e.host          # no clock asked for: device falls back to host


def test_timeline_host_device_summary_lines_and_trace():
    tl = Timeline()
    a = tl.record(0, 0, 0.0, 0.010, host=0.002, host_cpu=0.0015)
    tl.record(0, 1, 0.010, 0.020, host=0.003, host_cpu=0.002, device=0.009)
    tl.record(1, 0, 0.010, 0.020)
    new = tl.update(a, device=0.008)
    assert new.device == 0.008 and a.device is None and len(tl) == 3
    with pytest.raises(KeyError):
        tl.update(a, device=1.0)                 # a is no longer in the timeline
    s = tl.summary()
    assert s[0]["host_s"] == pytest.approx(0.005) and s[0]["device_s"] == pytest.approx(0.017)
    assert s[0]["host_cpu_s"] == pytest.approx(0.0035)
    assert s[1]["host_s"] is None and s[1]["device_s"] is None
    lines = tl.summary_lines()
    assert lines[0] == ("stage0: 2 chunks, busy 20.0 ms (100%), host 5.0 ms (cpu 3.5), "
                        "device 17.0 ms, waited 0.0 ms")
    assert lines[1].startswith("stage1: 1 chunks") and "host - ms" in lines[1]
    text = tl.format(width=20)
    assert text.splitlines()[-2:] == lines and lines[0] not in tl.format(20, summary=False)
    x = [e for e in tl.to_chrome_trace()["traceEvents"] if e["ph"] == "X"]
    assert x[0]["args"]["device_us"] == pytest.approx(8000) and "host_us" not in x[2]["args"]


# --- device assignment and hand-off options -----------------------------------------------------

def test_parse_and_assign_devices():
    from lite.engine.devices import assign_devices, parse_devices
    assert parse_devices(None) is None and parse_devices(" ") is None
    assert parse_devices("0, 1,3") == [0, 1, 3] and parse_devices([2, 0]) == [2, 0]
    for bad, msg in [("0,x", "comma-separated"), ("-1", "start at 0")]:
        with pytest.raises(LiteError, match=msg):
            parse_devices(bad)
    assert assign_devices(3, None) == [0, 0, 0]
    assert assign_devices(4, [0, 1]) == [0, 0, 1, 1]
    assert assign_devices(3, [2, 0]) == [2, 2, 0]
    assert assign_devices(5, [0, 1, 2]) == [0, 0, 1, 1, 2]
    assert assign_devices(4, [0, 0, 1, 1]) == [0, 0, 1, 1]        # explicit per-stage map
    assert assign_devices(2, [1, 0], n_available=2) == [1, 0]
    with pytest.raises(LiteError, match="3 GPUs for 2 stage"):
        assign_devices(2, [0, 1, 2])
    with pytest.raises(LiteError, match="GPU 2, but 2 GPU"):
        assign_devices(2, [0, 2], n_available=2)
    with pytest.raises(LiteError, match="at least one stage"):
        assign_devices(0, [0])


def test_resolve_handoff():
    from lite.engine.devices import resolve_handoff
    peers = lambda a, b: True
    assert resolve_handoff("host", [0, 1], "cuda", peers) == "host"
    assert resolve_handoff("auto", [0, 0], "cuda", peers) == "host"
    assert resolve_handoff("auto", [0, 1], "cpu") == "host"
    assert resolve_handoff("auto", [0, 1], "cuda") == "host"            # peers not queryable
    # auto takes p2p only when every neighbouring pair on different GPUs reaches the other way too
    assert resolve_handoff("auto", [0, 1], "cuda", peers) == "p2p"
    assert resolve_handoff("auto", [0, 0, 1, 1], "cuda", peers) == "p2p"
    assert resolve_handoff("p2p", [0, 0, 1, 1], "cuda", peers) == "p2p"
    no_1_2 = lambda a, b: {a, b} != {1, 2}
    assert resolve_handoff("auto", [0, 1, 2], "cuda", no_1_2) == "host"
    one_way = lambda a, b: (a, b) == (0, 1)
    assert resolve_handoff("auto", [0, 1], "cuda", one_way) == "host"
    cases = [([0, 1], "cpu", None, "GPU stages"), ([0, 0], "cuda", peers, "different GPUs"),
             ([0, 1], "cuda", lambda a, b: False, "GPU 0 cannot reach GPU 1"),
             ([0, 1, 2], "cuda", no_1_2, "GPU 1 cannot reach GPU 2"),
             ([0, 1], "cuda", one_way, "GPU 0 cannot reach GPU 1"),
             ([0, 1], "cuda", None, "cannot be queried")]
    for devs, backend, can, msg in cases:
        with pytest.raises(LiteError, match=msg) as info:
            resolve_handoff("p2p", devs, backend, can)
        assert "--handoff host" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(LiteError, match="must be one of"):
        resolve_handoff("pcie", [0])
    # --handoff-stream: GPU stages only, with either mode
    with pytest.raises(LiteError, match="needs GPU stages"):
        resolve_handoff("host", [0], "cpu", handoff_stream=True)
    assert resolve_handoff("host", [0, 1], "cuda", handoff_stream=True) == "host"
    assert resolve_handoff("auto", [0, 1], "cuda", peers, handoff_stream=True) == "p2p"


def test_resolve_handoff_without_p2p_copies(monkeypatch):
    from lite.engine import devices
    monkeypatch.setattr(devices, "P2P_IMPLEMENTED", False)
    peers = lambda a, b: True
    assert devices.resolve_handoff("auto", [0, 1], "cuda", peers) == "host"
    with pytest.raises(LiteError, match="not implemented"):
        devices.resolve_handoff("p2p", [0, 1], "cuda", peers)
