"""Two CuPy stand-ins for the CPU. FakeCupy checks the order of stream operations
(tests/test_multi_gpu.py).

Device memory is NumPy memory tagged with a device id; copies and "kernels" run at once on the
host, so data is always right. What the fake checks is the order a real GPU would guarantee: every
operation enqueued on a stream is logged with its dependencies (the previous operation on that
stream, and the operations behind any event the stream waited on). `FakeCupy.check_order()` then
requires every pair of conflicting memory accesses (write-read, read-write, write-write) to be
ordered by those dependencies; a missing event wait shows up as a race, even though the fake
happened to run the operations in a safe host order.

Also enforced, as CUDA does or as a real GPU would silently get wrong: an event is recorded only
on a stream of its own device; waiting on an event never recorded is an error (CUDA treats it as
done); memcpyAsync touches only the stream's own device (peer copies go through memcpyPeerAsync).
Nothing is ever freed, so addresses are never reused (CuPy's pool reuse is not modelled).

HostCupy (at the end) is simpler: host memory as the device, for the expert-streaming tests.

Stream capture (tests/test_decode_io.py): between a stream's begin_capture() and end_capture(),
copies and kernels enqueued on it are recorded as graph nodes and not run; a copy captured must
have both ends in registered memory (device or pinned: CUDA cannot capture a pageable copy), and
synchronizing a capturing stream is an error. FakeGraph.launch(stream) runs the nodes again, in
order, each logged as "graph:<what>".
"""
import contextlib
import ctypes
import itertools
import threading
import types

import numpy as np


class CUDARuntimeError(RuntimeError):
    def __init__(self, status):
        super().__init__(f"cudaError {status}")
        self.status = status


class FakeCupy:
    def __init__(self, n_devices=2):
        self.n_devices = n_devices
        self.ops = []            # dicts: id, what, stream, deps, reads, writes
        self.lock = threading.RLock()
        self.tls = threading.local()
        self.ranges = []         # (lo, hi, device or None for host): every allocation, kept alive
        self.keep = []
        self.streams = {}
        self.peer_enabled = set()
        self.calls = []          # (name, details) of runtime calls, for assertions
        self._ptrs = itertools.count(1000)
        fake = self

        class Device:
            def __init__(self, id=0):
                self.id = id

            def __enter__(self):
                fake._stack("dev").append(self.id)
                return self

            def __exit__(self, *a):
                fake._stack("dev").pop()

        class Stream:
            def __init__(self, non_blocking=False):
                self.device = fake.current_device()
                self.ptr = next(fake._ptrs)
                self.last, self.waits = None, []
                fake.streams[self.ptr] = self

            def __enter__(self):
                fake._stack("stream").append(self)
                return self

            def __exit__(self, *a):
                fake._stack("stream").pop()

            def wait_event(self, ev):
                with fake.lock:
                    if not ev.recorded:
                        raise AssertionError("stream waits on an event that was never recorded")
                    if ev.op is not None:
                        self.waits.append(ev.op)
                    fake.calls.append(("wait", self, ev))

            def record(self, event=None):
                ev = event or Event()
                ev.record(self)
                return ev

            def synchronize(self):
                assert self.capture is None, "synchronize on a capturing stream"
                fake.calls.append(("synchronize", self, None))

            capture = None          # graph nodes while capturing

            def begin_capture(self, mode=None):
                assert self.capture is None, "capture already in progress"
                self.capture = []

            def end_capture(self):
                nodes, self.capture = self.capture, None
                return FakeGraph(fake, nodes)

        class Event:
            def __init__(self, block=False, disable_timing=False, interprocess=False):
                self.device = fake.current_device()
                self.recorded, self.op = False, None

            def record(self, stream=None):
                stream = stream or fake.current_stream()
                if stream.device != self.device:
                    raise AssertionError(f"event of GPU {self.device} recorded on a stream of "
                                         f"GPU {stream.device}")
                with fake.lock:
                    self.recorded, self.op = True, stream.last
                    fake.calls.append(("record", stream, self))

            def synchronize(self):
                pass

        class runtime:
            memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice, memcpyDefault = 1, 2, 3, 4
            CUDARuntimeError = globals()["CUDARuntimeError"]

            @staticmethod
            def memcpyAsync(dst, src, n, kind, stream_ptr):
                st = fake.streams[stream_ptr]
                want = {1: (None, st.device), 2: (st.device, None), 3: (st.device, st.device)}[kind]
                got = (fake.device_of(src, n), fake.device_of(dst, n))
                assert got == want, f"memcpyAsync kind {kind} on GPU {st.device}: {got}"
                fake.copy(st, dst, src, n, f"memcpyAsync{kind}")

            @staticmethod
            def memcpyPeerAsync(dst, dst_dev, src, src_dev, n, stream_ptr):
                st = fake.streams[stream_ptr]
                assert (fake.device_of(src, n), fake.device_of(dst, n)) == (src_dev, dst_dev)
                fake.copy(st, dst, src, n, "memcpyPeerAsync")

            @staticmethod
            def deviceEnablePeerAccess(peer):
                pair = (fake.current_device(), peer)
                fake.calls.append(("enable_peer", pair, None))
                if pair in fake.peer_enabled:
                    raise CUDARuntimeError(704)
                fake.peer_enabled.add(pair)

            @staticmethod
            def getDeviceCount():
                return fake.n_devices

        class cuda:
            @staticmethod
            def using_allocator(alloc=None):
                return contextlib.nullcontext()
        cuda.Device, cuda.Stream, cuda.Event, cuda.runtime = Device, Stream, Event, runtime
        self.cuda = cuda
        self.ndarray = DeviceArray

    def get_default_memory_pool(self):
        class Pool:
            def malloc(self, size):
                raise AssertionError("the fake's arrays do not come from a pool")
        return Pool()

    # --- CuPy's array functions that the hand-off uses ----------------------------------------
    def empty(self, shape, dtype):
        a = np.zeros(shape, dtype).view(DeviceArray)
        a.fake, a.gpu = self, self.current_device()
        self._register(a, a.gpu)
        return a

    def zeros(self, shape, dtype):
        return self.empty(shape, dtype)

    def asnumpy(self, a, stream=None):     # into pageable memory (the driver stages it)
        out = np.empty(a.shape, a.dtype)
        self.copy(stream or self.current_stream(), out.ctypes.data, a.ctypes.data, a.nbytes,
                  "asnumpy")
        return out

    def ascontiguousarray(self, a):
        assert a.flags.c_contiguous
        return a

    def asarray(self, host):             # the host path: a synchronous copy in CuPy too
        a = self.empty(host.shape, host.dtype)
        self.copy(self.current_stream(), a.data.ptr, host.ctypes.data, a.nbytes, "asarray")
        return a

    def empty_pinned(self, shape, dtype):  # cupyx.empty_pinned
        a = np.zeros(shape, dtype)
        self._register(a, None)
        return a

    def kernel(self, stream, reads, writes, fn, what="kernel"):
        """A kernel on `stream` reading and writing these arrays; fn() computes it at once (or
        when the graph it is captured into is launched)."""
        reads, writes = [_span(a) for a in reads], [_span(a) for a in writes]
        if stream.capture is not None:
            stream.capture.append(("kernel", reads, writes, fn, what))
            return
        fn()
        self._enqueue(stream, what, reads, writes)

    # --- bookkeeping ----------------------------------------------------------------------------
    def _stack(self, what):
        if not hasattr(self.tls, what):
            setattr(self.tls, what, [])
        return getattr(self.tls, what)

    def current_device(self):
        s = self._stack("dev")
        return s[-1] if s else 0

    def current_stream(self):
        s = self._stack("stream")
        assert s, "no stream entered (CuPy would use the legacy default stream)"
        return s[-1]

    def _register(self, a, device):
        self.keep.append(a)
        self.ranges.append((a.ctypes.data, a.ctypes.data + max(a.nbytes, 1), device))

    def device_of(self, ptr, n):
        for lo, hi, dev in self.ranges:
            if lo <= ptr and ptr + n <= hi:
                return dev
        raise AssertionError(f"address {ptr:#x}+{n} was never allocated")

    def copy(self, stream, dst, src, n, what):
        if stream.capture is not None:
            self.device_of(src, n), self.device_of(dst, n)     # pageable memory: not capturable
            stream.capture.append(("copy", dst, src, n, what))
            return
        ctypes.memmove(dst, src, n)
        self._enqueue(stream, what, [(src, src + n)], [(dst, dst + n)])

    def _enqueue(self, stream, what, reads, writes):
        with self.lock:
            deps = ([stream.last] if stream.last is not None else []) + stream.waits
            op = dict(id=len(self.ops), what=what, stream=stream, deps=deps, reads=reads,
                      writes=writes)
            self.ops.append(op)
            stream.last, stream.waits = op["id"], []

    def check_order(self):
        """Every conflicting pair of accesses ordered on the device; returns the races found."""
        before = []
        for op in self.ops:
            anc = set(op["deps"])
            for d in op["deps"]:
                anc |= before[d]
            before.append(anc)
        races = []
        for b in self.ops:
            for a in self.ops[:b["id"]]:
                clash = (_overlap(a["writes"], b["reads"] + b["writes"])
                         or _overlap(a["reads"], b["writes"]))
                if clash and a["id"] not in before[b["id"]]:
                    races.append(f"{a['what']}#{a['id']} and {b['what']}#{b['id']} unordered")
        return races


class DeviceArray(np.ndarray):
    """NumPy memory standing for an array on GPU `device`; views keep the tag."""

    def __array_finalize__(self, obj):
        self.fake = getattr(obj, "fake", None)
        self.gpu = getattr(obj, "gpu", None)        # (NumPy 2 owns .device)

    @property
    def data(self):
        return _Ptr(self.ctypes.data)

    def get(self, out, stream):          # the host path's ndarray.get(out=, stream=)
        self.fake.copy(stream, out.ctypes.data, self.ctypes.data, self.nbytes, "get")

    def set(self, host, stream=None):    # ndarray.set: pinned or pageable source
        host = np.ascontiguousarray(host)
        assert host.nbytes == self.nbytes
        self.fake.copy(stream or self.fake.current_stream(), self.ctypes.data, host.ctypes.data,
                       self.nbytes, "set")

    def copy(self, order="C"):           # a new device array (CuPy's copy)
        a = self.fake.empty(self.shape, self.dtype)
        np.copyto(a, self)
        return a


class FakeGraph:
    """Nodes captured from one stream; launch() runs them on another (or the same) stream."""

    def __init__(self, fake, nodes):
        self.fake, self.nodes = fake, nodes

    def launch(self, stream):
        assert stream.capture is None
        for node in self.nodes:
            if node[0] == "copy":
                _, dst, src, n, what = node
                self.fake.copy(stream, dst, src, n, "graph:" + what)
            else:
                _, reads, writes, fn, what = node
                fn()
                self.fake._enqueue(stream, "graph:" + what, reads, writes)


class _Ptr:
    def __init__(self, ptr):
        self.ptr = ptr


def _span(a):
    return (a.ctypes.data, a.ctypes.data + a.nbytes)


def _overlap(xs, ys):
    return any(a < d and c < b for a, b in xs for c, d in ys)


@contextlib.contextmanager
def installed(monkeypatch, fake):
    """sys.modules' cupyx is this fake's while the block runs (the backend reaches CuPy itself
    through self.cp)."""
    import sys
    import types
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(empty_pinned=fake.empty_pinned))
    yield fake


# --- HostCupy -----------------------------------------------------------------------------------
# A CuPy stand-in with host memory as the "device", for the expert-streaming tests on the CPU
# (tests/test_expert_residency.py): arrays are NumPy arrays whose
# .data.ptr is their host address, so lite's raw copies (cudaMemcpyAsync) can be done by memmove.
class _Arr(np.ndarray):
    @property
    def data(self):
        return type("Ptr", (), {"ptr": self.ctypes.data})()


class HostCupy:
    """Host memory as the "device": memcpyAsync copies at once (and counts its calls), events and
    stream waits do nothing; asnumpy (a host sync) is counted, or refused with `no_sync`."""
    no_sync = False
    syncs = 0

    class cuda:
        class Stream:
            ptr = 0

            def __init__(self, **kw):
                pass

            def record(self):
                return types.SimpleNamespace(synchronize=lambda: None)

            def wait_event(self, ev):
                pass

        class runtime:
            memcpyHostToDevice = 1
            calls = 0

            @classmethod
            def memcpyAsync(cls, dst, src, n, kind, stream):
                cls.calls += 1
                ctypes.memmove(dst, src, n)

        @staticmethod
        def get_elapsed_time(a, b):
            return 0.0

    @staticmethod
    def empty(n, dtype):
        return np.zeros(n, dtype).view(_Arr)

    @staticmethod
    def zeros(n, dtype):
        return np.zeros(n, dtype).view(_Arr)

    @staticmethod
    def empty_like(a):
        return np.empty_like(a).view(_Arr)

    @staticmethod
    def asarray(a):
        return np.asarray(a).view(_Arr)

    @staticmethod
    def ascontiguousarray(a, dtype=None):
        return np.ascontiguousarray(a, dtype=dtype).view(_Arr)

    @classmethod
    def asnumpy(cls, a):
        if cls.no_sync:
            raise AssertionError("host sync (cp.asnumpy) in a path that must not have one")
        cls.syncs += 1
        return np.asarray(a).copy()
