"""Compile Numba kernels to sm_90 PTX on a machine without a GPU: the simulator runs kernels as
Python and misses typing that the real compiler meets (an int64/uint64 mix becoming float64, a
local array with a dynamic size). Needs the CUDA toolkit's libdevice (nvcc's install has it).

    python scripts/ptx_check.py Q4_0 Q4_1 Q5_0 Q5_1     # the matvec kernels of those types
"""
import os
import sys
import types as _t

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
from lite._compat import patch_numpy_for_numba  # noqa: E402

patch_numpy_for_numba()
import numba.cuda.cudadrv.libs as _libs  # noqa: E402
import numba.cuda.cudadrv.nvrtc as _nv  # noqa: E402
import numba.cuda.cudadrv.nvvm as _nvvm  # noqa: E402
import numba.cuda.dispatcher as _d  # noqa: E402

# No device to ask: pretend to be an sm_90 and point at the toolkit's libdevice.
_d.get_current_device = lambda: _t.SimpleNamespace(compute_capability=(9, 0))
_nv.get_supported_ccs = lambda: ((8, 0), (9, 0))
_LIBDEVICE = os.environ.get("LIBDEVICE", "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc")
_libs.get_libdevice = lambda: _LIBDEVICE
_nvvm.get_libdevice = _libs.get_libdevice

from numba import cuda, types as nt  # noqa: E402

from lite.kernels import matvec_basic  # noqa: E402


def main():
    arr = lambda t, d=1: nt.Array(t, d, "C")  # noqa: E731
    sig = (arr(nt.uint32), arr(nt.float16), arr(nt.float32, 2), arr(nt.float32, 2), nt.int64, nt.int64)
    for name in sys.argv[1:] or list(matvec_basic.SPECS):
        for n in (1, 3):
            ptx, _ = cuda.compile_ptx(matvec_basic.make_kernel(name, n).py_func, sig, cc=(9, 0))
            print(f"{name} n={n}: PTX ok, {ptx.count('.f64')} f64 ops, {ptx.count('.local')} local refs")


if __name__ == "__main__":
    main()
