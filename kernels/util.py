"""Small shared pieces for kernel wrappers: simulator detection, stream conversion."""
from lite._compat import patch_numpy_for_numba

patch_numpy_for_numba()

from numba import config as _numba_config  # noqa: E402
from numba import cuda  # noqa: E402

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

# lite orders all work of a stage on that stage's stream itself. Numba's default is to synchronize
# on the producer stream named by every CuPy array it receives (__cuda_array_interface__), which
# costs host time on each launch and breaks CUDA graph capture (cudaErrorStreamCaptureIsolation
# when the array names the legacy default stream), so it is turned off.
_numba_config.CUDA_ARRAY_INTERFACE_SYNC = False
# Small launches (one token, one expert) are intended; the occupancy warning would flood the log.
_numba_config.CUDA_LOW_OCCUPANCY_WARNINGS = False


def numba_stream(stream):
    """A Numba stream for a CuPy stream (or None -> the default stream).

    Launching on `cuda.external_stream(cupy_stream.ptr)` is what lets Numba kernels be
    captured into a CUDA graph together with CuPy work on the same stream.
    """
    if stream is None or SIMULATOR:
        return 0
    return cuda.external_stream(stream.ptr)


def as_device(a):
    """Array as a Numba device array (host arrays pass through under the simulator)."""
    if SIMULATOR:
        return a
    return cuda.as_cuda_array(a)
