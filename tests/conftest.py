"""Test setup: use the CUDA simulator for kernel tests where no GPU driver is present."""
import ctypes
import os


def _has_cuda_driver():
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


HAS_GPU = _has_cuda_driver() and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1"
if not HAS_GPU:
    # Must be set before numba is first imported.
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
