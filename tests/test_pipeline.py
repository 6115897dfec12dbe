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
