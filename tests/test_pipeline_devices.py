"""The stage chain's clocks and devices on the CPU: host and device time per stage-chunk, read after the
drain (an unreadable device clock leaves none), the timeline's host/device summary and trace; the
device assignment and the hand-off options."""
import time

import numpy as np
import pytest

from lite.errors import LiteError
from lite.chain.pipeline import ChunkJob, HostHandoff, StageChain
from lite.chain.timeline import Timeline
from test_pipeline import Sleeper


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
