"""Backends own one device each and implement the ops that models/ call.

resolve_backend(device) -> (device name, backend class). "auto" takes the GPU when one is usable
and falls back to the CPU with one warning otherwise; "cuda" without a usable GPU is an error.
"""
import importlib.util
import logging
import sys

from lite.errors import DeviceError

log = logging.getLogger(__name__)
DEVICES = ("auto", "cpu", "cuda")


def cuda_unavailable_reason():
    """None when a CUDA backend can run here, else why not (one line)."""
    # A CPU install has no CuPy: say so without importing the CUDA backend (and numba with it).
    if "cupy" not in sys.modules and importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'lite[cuda12]' or 'lite[cuda13]')"
    try:
        from lite.backends import cuda as cuda_backend  # noqa: F401
    except ImportError as e:
        return f"the CUDA backend cannot be imported ({e})"
    return cuda_backend.unavailable_reason()


def resolve_backend(device):
    if device not in DEVICES:
        raise DeviceError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        from lite.backends.cpu import CPUBackend
        return "cpu", CPUBackend
    why = cuda_unavailable_reason()
    if why is None:
        from lite.backends.cuda import CUDABackend
        return "cuda", CUDABackend
    if device == "cuda":
        raise DeviceError(f"--device cuda: {why}")
    log.warning("no usable GPU (%s); running on the CPU", why)
    from lite.backends.cpu import CPUBackend
    return "cpu", CPUBackend
