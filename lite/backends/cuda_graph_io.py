"""The host side of a captured decode step, cut to a few writes and one wait
(BackendConfig.graph_io, on by default).

Without it a decode step copies the token id from pageable memory to the device
(`ndarray.set`, staged by the driver), then the position from a pinned scalar (a second copy),
launches the graph, and copies the logits (128K floats on the 8B) into a fresh pageable array
(`cupy.asnumpy`: the driver stages 513 KB through its own pinned buffer, then the host waits).

With it, per stage:
  * one pinned host buffer holds [token id, position] (int64); the stage's graph starts with ONE
    memcpy node that copies it to the device buffer [ids, pos_dev] (pos_dev is a view of it, so the
    decode kernels read the position from there). Before a replay the host only writes the two
    numbers into pinned memory: no CUDA call besides the launch.
  * the last stage's logits go device -> pinned host with one cudaMemcpyAsync issued right after
    the launch (it queues behind the graph, so its host cost overlaps the GPU's work), then the
    host waits once. The array returned is a view of that pinned buffer, leased: the buffer goes
    back to a small pool only when the caller has dropped every array that views it (a weak
    reference on the lease's root array), so logits a caller keeps are never overwritten. When
    every pooled buffer is still held, the step falls back to copying into a fresh array.

A graph's memcpy node reads the pinned input when the graph runs, so the host must not rewrite it
while an earlier replay may still be pending: the last stage waits for its logits every step, and
a non-last stage waits on an event of its previous replay before writing (free when it is done,
which the stage chain's hand-offs already ensure).
"""
import contextlib
import gc
import threading
import weakref

import numpy as np

POOL_SIZE = 4           # pinned logits buffers a caller may hold at once before steps copy


_capture_lock = threading.Lock()
_captures = [0, False]          # captures in progress (all stages' threads), gc enabled before


@contextlib.contextmanager
def no_collection():
    """No cyclic garbage collection while any stage captures a graph: a collection (in whatever
    thread it falls: a stage's, the caller's) runs finalizers that may call CUDA (an event
    synchronized, a stream destroyed), which invalidates a capture in progress
    (cudaErrorStreamCaptureInvalidated, at random).
    The first capture collects what is pending, then holds collection off until the last ends."""
    with _capture_lock:
        if _captures[0] == 0:
            _captures[1] = gc.isenabled()
            gc.collect()
            gc.disable()
        _captures[0] += 1
    try:
        yield
    finally:
        with _capture_lock:
            _captures[0] -= 1
            if _captures[0] == 0 and _captures[1]:
                gc.enable()


class DecodeIO:
    """Pinned input and output of one CUDA backend's decode graphs (one per stage)."""

    def __init__(self, cp, cupyx, stream, pool_size=POOL_SIZE):
        self.cp, self.stream = cp, stream
        self._pinned = cupyx.empty_pinned
        self.host_in = cupyx.empty_pinned(2, np.int64)          # [token id, position]
        self.host_in[...] = 0
        with stream:                       # zeroed on lite's (non-blocking) stream, which writes it next
            self.dev_in = cp.zeros(2, np.int64)
        self.ids = self.dev_in[0:1]        # the first stage's graph input (embed reads it)
        self.pos_dev = self.dev_in[1:2]    # the backend's pos_dev
        self._done = None                  # event after the last replay (non-last stages)
        self._event = None
        self.pool = LeasePool(cupyx.empty_pinned, pool_size)
        self.copied_steps = 0              # steps that fell back to a copy (pool exhausted)

    # --- input -----------------------------------------------------------------------------------
    def input_ids(self, x):
        """The persistent input of a first stage (the ids view), holding x's token now."""
        x = np.asarray(x, dtype=np.int64).reshape(-1)
        if x.size != 1:
            raise ValueError(f"graph input is one token, got {x.size}")
        self.host_in[0] = x[0]
        self._copy_in()             # synchronous enough: later work on the stream sees it
        return self.ids

    def capture_in(self):
        """Called first while capturing: the graph's memcpy node pinned [token, pos] -> device."""
        self._copy_in()

    def _copy_in(self):
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(self.dev_in.data.ptr, self.host_in.ctypes.data, self.host_in.nbytes,
                       rt.memcpyHostToDevice, self.stream.ptr)

    def set_step(self, token, pos):
        """Before a replay: the token (None on stages that take hidden states) and position go to
        pinned memory; the graph's first node copies them."""
        if self._done is not None:
            self._done.synchronize()        # the previous replay has read host_in
            self._done = None
        if token is not None:
            self.host_in[0] = token[0]
        self.host_in[1] = pos

    def replayed(self, last):
        """After a replay: a non-last stage records an event that the next set_step waits on
        (the last stage waits for its logits anyway)."""
        if not last:
            if self._event is None:
                self._event = self.cp.cuda.Event(disable_timing=True)
            self._event.record(self.stream)
            self._done = self._event

    # --- output ----------------------------------------------------------------------------------
    def to_host(self, y):
        """Device (1, n) float32 logits -> a NumPy array on pinned memory (see LeasePool); None for
        anything else (the caller takes the old path)."""
        cp = self.cp
        if (not isinstance(y, cp.ndarray) or y.ndim != 2 or y.shape[0] != 1
                or y.dtype != np.float32 or not y.flags.c_contiguous):
            return None
        rt = cp.cuda.runtime
        slot = self.pool.take(y.shape, y.dtype)
        buf = self.pool.buffers[slot] if slot is not None else self.pool.scratch(y.shape, y.dtype)
        rt.memcpyAsync(buf.ctypes.data, y.data.ptr, y.nbytes, rt.memcpyDeviceToHost,
                       self.stream.ptr)
        self.stream.synchronize()
        self._done = None
        if slot is None:
            self.copied_steps += 1
            return buf.copy()
        return self.pool.lease(slot)


class LeasePool:
    """Pinned buffers handed out as NumPy arrays that own them while any view of them lives.

    lease(slot) returns a view of a fresh root array over the pinned buffer (np.frombuffer of a
    memoryview: every view NumPy makes of it keeps that root alive, as views collapse only to the
    first array whose base is not an array). A weak reference on the root puts the slot back on
    the free list when the last view dies."""

    def __init__(self, empty_pinned, size):
        self.empty_pinned, self.size = empty_pinned, size
        self.buffers = []
        self.free = []
        self._refs = {}
        self._views, self._release = [], []     # per slot: flat memoryview, weakref callback
        self._scratch = None

    def take(self, shape, dtype):
        """A free slot for an array of this shape (allocated on first need), or None."""
        if self.buffers and (self.buffers[0].shape != tuple(shape)
                             or self.buffers[0].dtype != dtype):
            self.buffers, self.free, self._refs = [], [], {}     # a new shape: start over
            self._views, self._release = [], []
        if self.free:
            return self.free.pop()
        if len(self.buffers) < self.size:
            buf = self.empty_pinned(tuple(shape), dtype)
            slot, free = len(self.buffers), self.free
            self.buffers.append(buf)
            self._views.append(memoryview(buf.reshape(-1)))
            self._release.append(lambda _ref, s=slot, f=free: f.append(s))
            return slot
        return None

    def scratch(self, shape, dtype):
        if self._scratch is None or self._scratch.shape != tuple(shape) or self._scratch.dtype != dtype:
            self._scratch = self.empty_pinned(tuple(shape), dtype)
        return self._scratch

    def lease(self, slot):
        buf = self.buffers[slot]
        root = np.frombuffer(self._views[slot], buf.dtype)
        self._refs[slot] = weakref.ref(root, self._release[slot])
        return root.reshape(buf.shape)

    @property
    def held(self):
        return len(self.buffers) - len(self.free)
