"""Per-stage timeline of a prefill: who computed which chunk when.

Every stage records one `Event` per chunk it computes (host wall time, `time.perf_counter`, from
the start of its hand-off read to the end of its hand-off write). `Timeline.rows()` draws the
diagram of docs/design.md scaled to time; `to_chrome_trace()` writes JSON that chrome://tracing and
ui.perfetto.dev open, one thread per stage.

Host against device time (docs/design.md, "The stage chain"): an event also
carries `host`, the wall seconds the stage thread spent issuing the chunk (hand-off read and
run()), `host_cpu`, the CPU seconds of that thread meanwhile (less than `host` by the time it
waited for the interpreter lock or blocked), and `device`, the seconds the device stream took
over the same span (between two CUDA events; on the CPU the same as `host`). The device time is
filled in after the chain has drained, so reading it never synchronizes a stage mid-chain.
"""
import json
import threading
from dataclasses import asdict, dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class Event:
    stage: int
    chunk: int
    start: float        # perf_counter seconds
    end: float
    request: int = 0
    waited: float = 0.0  # seconds the stage then waited for its successor to take the chunk
    name: str = ""       # "" draws as C<chunk>; "decode" for decode steps
    host: Optional[float] = None      # wall seconds issuing the chunk: hand-off read + run()
    host_cpu: Optional[float] = None  # CPU seconds of the stage thread over the same span
    device: Optional[float] = None    # device stream seconds over the same span

    @property
    def duration(self):
        return self.end - self.start

    @property
    def label(self):
        return self.name or f"C{self.chunk}"


class Timeline:
    """Thread-safe list of events; stages append from their worker threads."""

    def __init__(self, events=()):
        self._lock = threading.Lock()
        self._events = list(events)

    def record(self, stage, chunk, start, end, request=0, waited=0.0, name="", host=None,
               host_cpu=None, device=None):
        ev = Event(stage, chunk, start, end, request, waited, name, host, host_cpu, device)
        with self._lock:
            self._events.append(ev)
        return ev

    def update(self, ev, **changes):
        """Replace a recorded event by a copy with `changes` (e.g. device=seconds, known only
        after the drain); returns the new event."""
        new = replace(ev, **changes)
        with self._lock:
            for i, e in enumerate(self._events):
                if e is ev:
                    self._events[i] = new
                    return new
        raise KeyError(f"event {ev} is not in this timeline")

    @property
    def events(self):
        with self._lock:
            return sorted(self._events, key=lambda e: (e.stage, e.start))

    def __len__(self):
        return len(self._events)

    def stages(self):
        return sorted({e.stage for e in self.events})

    def span(self):
        """(first start, last end) over all events, or (0, 0) when empty."""
        evs = self.events
        if not evs:
            return 0.0, 0.0
        return min(e.start for e in evs), max(e.end for e in evs)

    def makespan(self):
        t0, t1 = self.span()
        return t1 - t0

    def busy(self, stage):
        """Seconds the stage spent computing (the sum of its events)."""
        return sum(e.duration for e in self.events if e.stage == stage)

    def summary(self):
        """Per stage: chunks, busy seconds, utilization over the makespan, seconds waited, and
        the totals of host, host_cpu and device seconds (None where no event has them)."""
        total = self.makespan() or 1.0
        evs_all = self.events
        out = {}
        for s in self.stages():
            evs = [e for e in evs_all if e.stage == s]
            busy = sum(e.duration for e in evs)
            out[s] = {"chunks": len(evs), "busy_s": busy, "utilization": busy / total,
                      "waited_s": sum(e.waited for e in evs)}
            for key in ("host", "host_cpu", "device"):
                vals = [getattr(e, key) for e in evs if getattr(e, key) is not None]
                out[s][key + "_s"] = sum(vals) if vals else None
        return out

    def summary_lines(self):
        """One line a stage: e.g. `stage1: 4 chunks, busy 120.3 ms (91%), host 31.0 ms
        (cpu 29.8), device 112.4 ms, waited 0.4 ms`. Host well below device: the device is the
        bottleneck, as it should be; host near or above device: the stage is bound by Python."""
        ms = lambda v: "-" if v is None else f"{1e3 * v:.1f}"
        out = []
        for s, d in self.summary().items():
            out.append(f"stage{s}: {d['chunks']} chunks, busy {ms(d['busy_s'])} ms "
                       f"({100 * d['utilization']:.0f}%), host {ms(d['host_s'])} ms "
                       f"(cpu {ms(d['host_cpu_s'])}), device {ms(d['device_s'])} ms, "
                       f"waited {ms(d['waited_s'])} ms")
        return out

    def rows(self, width=100):
        """One ascii row per stage, columns proportional to time, e.g.
        stage0: [C0][C1][C2]
        stage1:     [C0][C1][C2]
        An event too narrow for its label shows as much of `[Cn]` as fits."""
        evs = self.events
        if not evs:
            return []
        t0, t1 = self.span()
        scale = (t1 - t0) / width if t1 > t0 else 1.0
        lines = []
        name_w = max(len(f"stage{s}") for s in self.stages()) + 1
        for s in self.stages():
            cells = [" "] * width
            for e in (e for e in evs if e.stage == s):
                # rounding both ends the same way keeps back-to-back chunks from overlapping
                a = min(width - 1, round((e.start - t0) / scale))
                b = max(a + 1, min(width, round((e.end - t0) / scale)))
                text = _cell(e.label, b - a)
                cells[a:b] = list(text)
            lines.append(f"{'stage%d:' % s:<{name_w}} " + "".join(cells).rstrip())
        return lines

    def format(self, width=100, summary=True):
        """The header, the rows and (with summary) the per-stage totals of summary_lines()."""
        t0, t1 = self.span()
        head = f"timeline: {len(self)} events, {1e3 * (t1 - t0):.1f} ms"
        return "\n".join([head] + self.rows(width) + (self.summary_lines() if summary else []))

    def to_chrome_trace(self, path=None, process_name="lite"):
        """Chrome/Perfetto trace events ("X" complete events, microseconds from the first start);
        one thread per stage. Writes the JSON to `path` when given; returns the dict."""
        t0, _ = self.span()
        events = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
                   "args": {"name": process_name}}]
        for s in self.stages():
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": s,
                           "args": {"name": f"stage{s}"}})
        for e in self.events:
            events.append({"name": e.label, "cat": "decode" if e.name == "decode" else "prefill",
                           "ph": "X", "pid": 0, "tid": e.stage,
                           "ts": (e.start - t0) * 1e6, "dur": e.duration * 1e6,
                           "args": {"chunk": e.chunk, "request": e.request,
                                    "waited_us": e.waited * 1e6,
                                    **{k + "_us": getattr(e, k) * 1e6
                                       for k in ("host", "host_cpu", "device")
                                       if getattr(e, k) is not None}}})
        trace = {"traceEvents": events, "displayTimeUnit": "ms"}
        if path is not None:
            with open(path, "w") as f:
                json.dump(trace, f)
        return trace

    def to_dicts(self):
        return [asdict(e) for e in self.events]


def _cell(label, w):
    # "[C12---]" when there is room; the bracket keeps back-to-back chunks apart.
    text = f"[{label}"
    if w >= len(text) + 1:
        return text + "-" * (w - len(text) - 1) + "]"
    return (text + "]")[:w] if w > 1 else "#"
