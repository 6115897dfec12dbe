"""The stage chain: a prefill streams chunk after chunk through S stages, every stage busy at once.

The StageRunner protocol (what the engine implements per layer range):

    run(job: ChunkJob, x) -> y
        Compute this stage's layers for one chunk. On the first stage x is `job.input` (token ids);
        on the others it is what `from_handoff` returned. Returns hidden states (T, n_embd) with the
        token axis first, or, on the last stage, whatever the caller wants back (logits).
        Calls on one runner are serial and in chunk order (a stage keeps a KV cache).
    alloc_handoff(shape, dtype) -> buf
        A host buffer for this stage's output: pinned memory on a GPU stage, np.empty on the CPU.
        The chain keeps depth+1 of them per stage (two by default: double-buffered) and reuses them
        alternately; it hands `buf[:T]` (a contiguous view) to the calls below.
    to_handoff(y, buf) -> None
        Write y into buf. When it returns, buf must hold y, or carry an event that the
        successor's from_handoff waits on (GPU --handoff p2p / --handoff-stream:
        lite/backends/cuda_handoff.py; the host path synchronizes its copy).
    from_handoff(buf) -> x     (called on the successor)
        Turn the predecessor's buffer into this stage's input (a GPU stage copies it to its device).
        buf stays untouched until this stage's job for the chunk has returned, so a CPU stage may
        return buf itself; a GPU stage whose copy is asynchronous must either have it finished by
        the end of its job (the host path: a non-last stage's to_handoff synchronizes its stream)
        or leave an event the producer's device waits on before writing buf again (p2p).
    pass_on(y, successor) -> x     (only for a server step, StepJob)
        Hand a step's rows to the successor's runner without a buffer (a lite Stage: the array
        itself on the same device once its stream is done, else a host copy).

Prefill runs each runner's calls on that stage's worker thread; `decode` (a decode step, or a
server step's rows) runs them on the caller's thread. So a runner must not depend on thread-local
state: a GPU runner enters its device and passes its stream explicitly on every call.

Scheduling (docs/design.md "The stage chain"): a stage computes a chunk, writes its hand-off buffer,
waits only if its successor still holds `handoff_depth` earlier chunks, submits the chunk to the
successor, keeps that future on itself (not in its call frame) and returns to take its next chunk.
The root submits every chunk to stage 0, then drains the futures once, in order. mode="sync" makes
each stage wait for the rest of the chain before returning (the old behaviour), for comparison.
"""
import logging
import threading
from contextlib import nullcontext as _nullcontext
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from time import perf_counter, thread_time
from typing import Protocol, Sequence, runtime_checkable


from lite.backends.cpu import HostHandoff  # noqa: F401  (the CPU hand-off, re-exported for runners)
from lite.errors import LiteError
from lite.chain.jobs import ChunkJob, StageError, StepJob, make_jobs  # noqa: F401  (the chain's jobs)
from lite.chain.timeline import Timeline

log = logging.getLogger(__name__)

MODES = ("chain", "sync")


@runtime_checkable
class StageRunner(Protocol):
    def run(self, job: ChunkJob, x): ...
    def alloc_handoff(self, shape, dtype): ...
    def to_handoff(self, y, buf) -> None: ...
    def from_handoff(self, buf): ...


class StreamTimer:
    """Device time on one CUDA stream: mark() records an event on it, elapsed(a, b) is the
    stream's seconds from a to b (kernel time plus any gap while the GPU waited for the host;
    with virtual stages it includes the other stages' kernels running meanwhile)."""

    def __init__(self, stream, device=None):
        import cupy
        self.cp, self.stream, self.device = cupy, stream, device

    def mark(self):
        # The event must belong to the stream's device, whatever device this thread is in.
        with self.device if self.device is not None else _nullcontext():
            ev = self.cp.cuda.Event()
            ev.record(self.stream)
        return ev

    def elapsed(self, a, b):
        b.synchronize()
        return self.cp.cuda.get_elapsed_time(a, b) / 1e3


def device_timer(runner):
    """The runner's own `device_timer()` when it has one (a lite Stage: a StreamTimer on its GPU
    stream), else None (on the CPU the device time is the host time)."""
    own = getattr(runner, "device_timer", None)
    return own() if callable(own) else None


class _Cancelled(Exception):
    """A job skipped because an earlier job of the request failed."""


class _Next:
    """A stage's return value in chain mode: its successor's future for the same chunk."""
    __slots__ = ("fut",)

    def __init__(self, fut):
        self.fut = fut


class _Stage:
    def __init__(self, chain, index, runner, threaded):
        self.chain, self.index, self.runner = chain, index, runner
        self.next = None                     # successor _Stage
        self.pending = deque()               # successor futures this stage submitted, oldest first
        self.slots = [None] * (chain.handoff_depth + 1)
        self.pool = (ThreadPoolExecutor(1, thread_name_prefix=f"lite-stage{index}")
                     if threaded else None)
        self.timer = device_timer(runner) if chain.device_times else None

    def submit(self, job, payload):
        return self.pool.submit(self._work, job, payload)

    def slot(self, i, y):
        # Grow-only: the short last chunk of a request takes a view, not a new pinned buffer.
        buf = self.slots[i]
        T = y.shape[0]
        if (buf is None or buf.dtype != y.dtype or buf.shape[1:] != y.shape[1:]
                or buf.shape[0] < T):
            cap = T if buf is None or buf.shape[1:] != y.shape[1:] else max(T, buf.shape[0])
            buf = self.runner.alloc_handoff((cap,) + tuple(y.shape[1:]), y.dtype)
            self.slots[i] = buf
        return buf[:T]

    def compute(self, job, payload, slot_index, buffered=True):
        """from_handoff + run + to_handoff; returns (y, buf, times): buf is None on the last
        stage; times = (host s, host cpu s, device marks or None) over from_handoff + run, or None
        in decode (no clocks: StageChain.decode does not read them, and two CUDA events a stage a
        token would cost more than they tell). buffered=False (a server step): no hand-off
        buffer, y is what the runner's pass_on gives the successor."""
        timed = not job.decode
        try:
            if timed:
                timer = self.timer
                t0, c0 = perf_counter(), thread_time()
                m0 = timer.mark() if timer is not None else None
            x = payload if self.index == 0 or not buffered else self.runner.from_handoff(payload)
            y = self.runner.run(job, x)
            times = None
            if timed:
                marks = (m0, timer.mark()) if timer is not None else None
                times = (perf_counter() - t0, thread_time() - c0, marks)
            if self.next is None:
                return y, None, times
            if not buffered:
                return self.runner.pass_on(y, self.next.runner), None, times
            buf = self.slot(slot_index, y)
            self.runner.to_handoff(y, buf)
            return y, buf, times
        except Exception as e:
            err = StageError(self.index, job, e)
            self.chain._fail(err)
            raise err from e

    def _work(self, job, payload):
        chain = self.chain
        if chain._abort.is_set():
            raise _Cancelled()
        t0 = perf_counter()
        y, buf, times = self.compute(job, payload, job.index % len(self.slots))
        t1 = perf_counter()
        if buf is None:
            chain._record(self.index, job, t0, t1, 0.0, times, self.timer)
            return y
        # One outstanding job per successor (handoff_depth): wait for the oldest to finish, without
        # raising its error here; the root reports the first failure.
        while len(self.pending) >= chain.handoff_depth:
            wait([self.pending.popleft()])
        t2 = perf_counter()
        chain._record(self.index, job, t0, t1, t2 - t1, times, self.timer)
        fut = self.next.submit(job, buf)
        if chain.mode == "sync":
            return fut.result()        # the old behaviour: wait for the whole rest of the chain
        self.pending.append(fut)
        return _Next(fut)


class StageChain:
    """S stages in a row. `run(jobs)` / `prefill(ids, chunk)` return the last stage's output per
    chunk, in order; `decode(x, job)` passes one step (a decode step, a server step) through all
    stages."""

    def __init__(self, stages: Sequence[StageRunner], mode="chain", handoff_depth=1,
                 device_times=True):
        if not stages:
            raise LiteError("a stage chain needs at least one stage")
        if mode not in MODES:
            raise LiteError(f"pipeline mode must be one of {', '.join(MODES)}, got {mode!r}")
        if int(handoff_depth) < 1:
            raise LiteError(f"hand-off depth must be at least 1, got {handoff_depth}")
        for i, r in enumerate(stages):
            if not isinstance(r, StageRunner):
                raise LiteError(f"stage {i} ({type(r).__name__}) does not implement StageRunner: "
                                "run, alloc_handoff, to_handoff, from_handoff")
        self.mode, self.handoff_depth = mode, int(handoff_depth)
        self.device_times = device_times    # record device time per stage-chunk (GPU stages)
        self._marks = []                    # (event, timer, marks) read after the drain
        threaded = len(stages) > 1     # one stage runs as a plain loop on the caller's thread
        self._stages = [_Stage(self, i, r, threaded) for i, r in enumerate(stages)]
        for a, b in zip(self._stages, self._stages[1:]):
            a.next = b
        self._lock = threading.Lock()       # one request at a time
        self._err_lock = threading.Lock()
        self._abort = threading.Event()
        self._error = None
        self._timeline = None
        self.timeline = None                # the Timeline of the last run
        self._closed = False

    @property
    def n_stages(self):
        return len(self._stages)

    @property
    def runners(self):
        return [s.runner for s in self._stages]

    def prefill(self, ids, chunk, request_id=0, start=0, timeline=None):
        return self.run(make_jobs(ids, chunk, request_id, start), timeline)

    def run(self, jobs, timeline=None):
        """Push every job through the chain; returns the last stage's outputs, one per job."""
        jobs = list(jobs)
        with self._lock:
            self._check_open()
            self._reset()
            self.timeline = self._timeline = timeline if timeline is not None else Timeline()
            if len(self._stages) == 1:
                return self._run_inline(jobs)
            return self._run_threaded(jobs)

    def _run_inline(self, jobs):
        st, outs = self._stages[0], []
        for job in jobs:
            t0 = perf_counter()
            y, _, times = st.compute(job, job.input, 0)
            self._record(0, job, t0, perf_counter(), 0.0, times, st.timer)
            outs.append(y)
        self._read_device_times()
        return outs

    def _run_threaded(self, jobs):
        root = self._stages[0]
        futs = [root.submit(job, job.input) for job in jobs]
        outs = []
        try:
            for f in futs:
                r = f.result()
                while isinstance(r, _Next):
                    r = r.fut.result()
                outs.append(r)
        except BaseException as e:
            self._abort.set()
            self._quiesce()
            err = self._error
            self._reset()
            if err is not None and not isinstance(e, KeyboardInterrupt):
                raise err from err.__cause__
            raise
        for st in self._stages:
            st.pending.clear()
        self._read_device_times()
        return outs

    def decode(self, x, job, timeline=None):
        """One step through all stages in order, on the caller's thread: a decode step (usually
        one token, ChunkJob.decode_step) or a server step (StepJob: the stacked rows of several
        sequences; x its input, each stage runs job.at(stage)). Returns the last stage's output.

        Decode is strictly serial: stage k+1 needs stage k's output for the same token, and the
        next token needs the last stage's. Worker threads could overlap nothing and would add two
        thread wake-ups per stage per token to a step meant to cost a few graph replays. A
        server step's rows go stage to stage without a hand-off buffer (the runner's pass_on)."""
        rows = isinstance(job, StepJob)
        name = "step" if rows else "decode"
        with self._lock:
            self._check_open()
            if self._error is not None or self._marks or self._abort.is_set():
                self._reset()
            for st in self._stages:
                t0 = perf_counter()
                y, buf, _ = st.compute(job.at(st.index) if rows else job, x, 0, not rows)
                if timeline is not None:
                    timeline.record(st.index, job.index, t0, perf_counter(), job.request_id,
                                    name=name)
                x = y if rows else buf
            return y

    def _reset(self):
        # Only called while no stage thread runs (between requests), so no lock is needed.
        self._abort.clear()
        self._error = None
        self._marks = []

    def _record(self, stage, job, t0, t1, waited, times=None, timer=None):
        host, host_cpu, marks = times if times is not None else (None, None, None)
        # without a device clock (CPU) the device time is the host time of the same span
        ev = self._timeline.record(stage, job.index, t0, t1, job.request_id, waited,
                                   "decode" if job.decode else "", host, host_cpu,
                                   host if marks is None else None)
        if marks is not None:
            with self._err_lock:
                self._marks.append((ev, timer, marks))

    def _read_device_times(self):
        """Fill in the events' device times once the chain has drained: reading a CUDA event
        waits for it, which mid-chain would stall the stage that reads it."""
        marks, self._marks = self._marks, []
        for ev, timer, (m0, m1) in marks:
            try:
                self._timeline.update(ev, device=timer.elapsed(m0, m1))
            except Exception as e:      # a clock that fails must not fail the prefill
                log.warning("stage %d chunk %d: device time unreadable: %s", ev.stage, ev.chunk, e)

    def _fail(self, err):
        with self._err_lock:
            if self._error is None:
                self._error = err
                self._abort.set()
                log.debug("stage chain aborting: %s", err)

    def _quiesce(self):
        # Stage k receives work only from stage k-1's jobs, so once stage k-1's queue has drained
        # (aborted jobs return at once) nothing new can reach stage k: drain in order.
        for st in self._stages:
            if st.pool is not None:
                st.pool.submit(lambda: None).result()
            st.pending.clear()

    def _check_open(self):
        if self._closed:
            raise LiteError("the stage chain is closed")

    def close(self):
        if self._closed:
            return
        self._closed = True
        for st in self._stages:
            if st.pool is not None:
                st.pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            for st in self._stages:
                if st.pool is not None:
                    st.pool.shutdown(wait=False)
        except Exception:
            pass
