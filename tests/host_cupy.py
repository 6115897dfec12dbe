"""A CuPy stand-in with host memory as the "device", for the expert-streaming tests on the CPU
(tests/test_expert_residency.py): arrays are NumPy arrays whose
.data.ptr is their host address, so lite's raw copies (cudaMemcpyAsync) can be done by memmove."""
import ctypes
import types

import numpy as np


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
