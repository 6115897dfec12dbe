"""IQ3_XXS_B16 (kernels/iq3_b16.py's layout) dequantized to fp16 or fp32 rows: prefill's GEMMs over the GPU
backend's B16 matrices (lite/backends/cuda_linear.py _dequant_f16). Not in the registry: a record interleaves
16 rows, so unlike the registry's launchers this one needs the matrix's shape. Its bandwidth against the
copy ceiling: BENCHMARKS.md. The CUDA C: kernels/cuda/dequant_iq3_b16.cuh.

A warp a record (a band of 16 rows, a block of 256 columns), 4 records a CTA (2 for fp32); lane 4g + q
decodes its 32 grid words (rows g and g + 8, words q and q + 4 of each chunk) as 4 values each into
shared memory, from which the warp writes whole rows. The arithmetic is
gguf-py's, in its order: (d (0.5 + sc)) 0.5, times the grid value, the sign last, so that fp32
output equals gguf.quants.dequantize exactly.
"""
import functools

import numpy as np

from lite.kernels import iq3_b16
from lite.kernels.cuda_source import includes, source

def c_source():
    """The kernel after the unsigned grid it reads (the module adds the half helpers: _module)."""
    return source("iq3_grid.cuh", "dequant_iq3_b16.cuh")


WARPS = {np.dtype(np.float16): 4, np.dtype(np.float32): 2}      # LtDqb<O>::W


def launch_shape(rows, cols, out_dtype):
    """(grid, block) of dqb for a rows x cols matrix of out_dtype: a warp a record."""
    w = WARPS[np.dtype(out_dtype)]
    return (-(-(cols // 256) // w), rows // 16), (32 * w,)


@functools.lru_cache(maxsize=None)
def _module(device):
    import cupy
    return cupy.RawModule(code=includes("iq_helpers.cuh", "iq3_grid.cuh", "dequant_iq3_b16.cuh"), options=("--std=c++17",),
                          name_expressions=["dqb<float>", "dqb<unsigned short>"])


def dequantize(records, rows, cols, out_dtype=np.float16, stream=None, out=None):
    """IQ3_XXS_B16 records (iq3_b16.repack's) as a (rows, cols) matrix of out_dtype (float16 or
    float32) on `stream`, into `out` if given; no host synchronization."""
    import contextlib

    import cupy
    iq3_b16.check_shape(rows, cols)
    if records.size != iq3_b16.nbytes(rows, cols):
        raise ValueError(f"{iq3_b16.NAME}: {records.size} bytes for {rows}x{cols} (want {iq3_b16.nbytes(rows, cols)})")
    dt = np.dtype(out_dtype)
    if dt not in (np.dtype(np.float16), np.dtype(np.float32)):
        raise ValueError(f"{iq3_b16.NAME}: out_dtype float16 or float32, not {dt}")
    out = cupy.empty((rows, cols), dt) if out is None else out.reshape(rows, cols)
    f = _module(cupy.cuda.runtime.getDevice()).get_function("dqb<float>" if dt == np.float32 else "dqb<unsigned short>")
    with stream if stream is not None else contextlib.nullcontext():
        f(*launch_shape(rows, cols, dt), (records, out, np.int32(rows), np.int32(cols)))
    return out
