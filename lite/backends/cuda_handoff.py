"""Hand-off of hidden states between GPU stages: the StageRunner calls of lite.chain.pipeline
(alloc_handoff, to_handoff, from_handoff) for the CUDA backend, a mixin of CUDABackend.

Three ways, chosen per chain by lite.engine.devices.resolve_handoff and set here by configure_handoff:

host (the default, unchanged since before --handoff existed): the producer copies y into a pinned
  host buffer and synchronizes its stream; the consumer copies the buffer onto its own GPU.
p2p (--handoff p2p): the buffer lives on the producer's GPU. The producer copies y into it and
  records an event; the consumer's stream waits on that event (no host sync) and copies it peer to
  peer (cudaMemcpyPeerAsync) into an array on its own GPU.
--handoff-stream (with host or p2p): the producer's copy runs on a copy stream of its own, ordered
  after the compute stream by an event, so the copy of chunk c overlaps the compute of chunk c+1.
  With host buffers the consumer then also waits on an event instead of the producer's host sync.

The asynchronous ways keep these events in the slot's HandoffBuffer (_SlotState):
  written  recorded by the producer after its copy into the slot; the consumer's stream waits on it
           before copying out.
  read     recorded by the consumer after its copy out; the producer's stream waits on it before
           writing the slot again. The chain reuses a slot only once the consumer's job returned,
           but without a host sync that copy may still be in flight on the device.
  src      with a copy stream, y is kept alive until its slot is written again, and the compute
           stream then waits on `written` before y is freed: released earlier, CuPy's pool (keyed
           by stream) could hand y's memory to the next chunk's kernels while the copy still reads.

Checked on the CPU against a fake CuPy that logs every stream operation and checks their order
(tests/test_multi_gpu.py), which also compares host/p2p and copy stream on/off on two GPUs.
"""
import logging

log = logging.getLogger(__name__)

HANDOFF_MODES = ("host", "p2p")
PEER_ACCESS_ALREADY_ENABLED = 704        # cudaErrorPeerAccessAlreadyEnabled


class _SlotState:
    """The events of one hand-off slot (see the module docstring), shared by its views."""
    __slots__ = ("array", "device_id", "on_device", "written", "read", "src")

    def __init__(self, array, device_id, on_device):
        self.array, self.device_id, self.on_device = array, device_id, on_device
        self.written = self.read = self.src = None

    def __del__(self):
        # The chain drops a slot's buffer when it grows it: wait for the last copies that touch
        # it first, or the pool could reuse its memory under them (rare: only while chunks grow).
        try:
            for ev in (self.read, self.written):
                if ev is not None:
                    ev.synchronize()
        except Exception:       # interpreter shutdown: CuPy may be gone already
            pass


class HandoffBuffer:
    """A slot of hand-off memory, (T, n_embd): a device array on the producer's GPU (p2p) or a
    pinned host array (host with a copy stream). Slicing gives a view sharing the slot's events,
    as the chain hands on buf[:T]."""
    __slots__ = ("array", "state")

    def __init__(self, array, state):
        self.array, self.state = array, state

    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype

    def __len__(self):
        return len(self.array)

    def __getitem__(self, key):
        return HandoffBuffer(self.array[key], self.state)


class CUDAHandoff:
    """Needs self.cp, self.device (a cupy Device), self.stream, self.activate()."""
    handoff_mode = "host"
    copy_stream = None          # --handoff-stream: the stream hand-off copies run on

    def configure_handoff(self, mode="host", copy_stream=False):
        """Set by the Stage from the chain's resolved --handoff and --handoff-stream."""
        if mode not in HANDOFF_MODES:
            raise ValueError(f"hand-off mode must be one of {HANDOFF_MODES}, got {mode!r}")
        self.handoff_mode = mode
        if copy_stream and self.copy_stream is None:
            with self.device:
                self.copy_stream = self.cp.cuda.Stream(non_blocking=True)
        elif not copy_stream:
            self.copy_stream = None

    @property
    def _async_handoff(self):
        return self.handoff_mode == "p2p" or self.copy_stream is not None

    # --- producer --------------------------------------------------------------------------------
    def alloc_handoff(self, shape, dtype):
        import cupyx
        if not self._async_handoff:
            return cupyx.empty_pinned(shape, dtype)             # host: as before
        if self.handoff_mode == "p2p":
            with self.activate():                               # on the producer's GPU
                arr = self.cp.empty(shape, dtype)
        else:
            arr = cupyx.empty_pinned(shape, dtype)
        return HandoffBuffer(arr, _SlotState(arr, self.device.id, self.handoff_mode == "p2p"))

    def to_handoff(self, y, buf):
        if not isinstance(buf, HandoffBuffer):
            y.get(out=buf, stream=self.stream)                  # host: as before
            self.stream.synchronize()
            return
        cp, rt, st = self.cp, self.cp.cuda.runtime, buf.state
        with self.activate():
            y = cp.ascontiguousarray(y)
            if y.nbytes != buf.array.nbytes:
                raise ValueError(f"hand-off of {y.shape} {y.dtype} into a {buf.shape} "
                                 f"{buf.dtype} buffer")
            stream = self.copy_stream or self.stream
            if st.src is not None:
                # the previous y of this slot may now go back to the compute stream's pool
                self.stream.wait_event(st.written)
                st.src = None
            if st.read is not None:
                stream.wait_event(st.read)          # the consumer's copy of the last chunk is done
            if self.copy_stream is not None:
                stream.wait_event(self._record(self.stream))    # y is computed
                st.src = y
            dst = buf.array.data.ptr if st.on_device else buf.array.ctypes.data
            kind = rt.memcpyDeviceToDevice if st.on_device else rt.memcpyDeviceToHost
            rt.memcpyAsync(dst, y.data.ptr, y.nbytes, kind, stream.ptr)
            st.written, st.read = self._record(stream), None

    # --- consumer --------------------------------------------------------------------------------
    def from_handoff(self, buf):
        if not isinstance(buf, HandoffBuffer):
            with self.activate():                               # host: as before
                return self.cp.asarray(buf)
        cp, rt, st = self.cp, self.cp.cuda.runtime, buf.state
        if st.written is None:
            raise RuntimeError("from_handoff before the producer's to_handoff")
        with self.activate():
            x = cp.empty(buf.shape, buf.dtype)
            self.stream.wait_event(st.written)                  # on the device, not the host
            if not st.on_device:
                rt.memcpyAsync(x.data.ptr, buf.array.ctypes.data, x.nbytes,
                               rt.memcpyHostToDevice, self.stream.ptr)
            elif st.device_id == self.device.id:
                rt.memcpyAsync(x.data.ptr, buf.array.data.ptr, x.nbytes,
                               rt.memcpyDeviceToDevice, self.stream.ptr)
            else:
                self._enable_peer(st.device_id)
                rt.memcpyPeerAsync(x.data.ptr, self.device.id, buf.array.data.ptr, st.device_id,
                                   x.nbytes, self.stream.ptr)
            st.read = self._record(self.stream)
        return x

    def _enable_peer(self, peer):
        """Let this GPU reach `peer`'s memory, once per pair; CuPy's pool may have done it
        already. Without it cudaMemcpyPeerAsync still works, staged through the host."""
        enabled = self.__dict__.setdefault("_peers_enabled", set())
        if peer in enabled:
            return
        enabled.add(peer)
        rt = self.cp.cuda.runtime
        # for the current device (this one). CuPy's private helper also clears the runtime's
        # last-error state that "already enabled" leaves behind; older CuPy lacks it.
        enable = getattr(rt, "_deviceEnsurePeerAccess", None) or rt.deviceEnablePeerAccess
        try:
            enable(peer)
        except rt.CUDARuntimeError as e:
            if getattr(e, "status", None) != PEER_ACCESS_ALREADY_ENABLED:
                log.warning("GPU %d cannot enable peer access to GPU %d (%s): p2p hand-offs "
                            "will be staged by the driver", self.device.id, peer, e)

    def _record(self, stream):
        """An event on `stream` (the current device must be the stream's)."""
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        return ev

    def synchronize_handoff(self):
        if self.copy_stream is not None:
            self.copy_stream.synchronize()
