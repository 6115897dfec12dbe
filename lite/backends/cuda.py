"""The CUDA backend (CuPy + Numba kernels). Not built yet: see issue 4.

unavailable_reason() says why lite cannot run on a GPU here, so that --device auto falls back to
the CPU with one warning and --device cuda fails with a clear error.
"""


def unavailable_reason():
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'lite[cuda12]' or 'lite[cuda13]')"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device found"
    except Exception as e:  # no driver, or a driver too old for this CuPy
        return f"no usable CUDA driver ({str(e).splitlines()[0]})"
    return "lite's GPU backend is not implemented yet"
