"""Fused dequantize-and-dot for IQ3_XXS and IQ4_XS: out (n, rows) f32 = x (n, cols) f32 @ W.T.

Two implementations of the same product:
- Numba (the reference, what CI runs under the simulator): one 32-thread block per row, a thread
  per group of 8 weights decoded by dequant_iq's per-type functions (so the decode is the one
  checked bit for bit against gguf-py), fp32 accumulation, reduce.warp_sum across the row.
- CUDA C (the GPU path, a CuPy RawModule): a 128-thread block per 4 rows, a thread per 32-weight
  sub-block. The x chunk a thread loads is reused for all 4 rows (x is 32 bits a weight against
  3-4.25 bits of weight, so without reuse x traffic would swamp L1); the sub-block scale
  multiplies once per 32 weights. IQ3_XXS: the grid as packed bytes, read through L1 (mv_iq3xxs: one
  copy in shared memory; a float4 grid and a sign-mask table there were bound by bank conflicts of
  random 16-byte gathers); bytes become
  floats by the 2^23 exponent trick (PRMT + FADD, not the slow I2F unit), signs flip x's sign bit.
  Templated on n (up to C_MAX_N, larger n in chunks) so the accumulators stay in registers.
  For IQ3_XXS and n = 1 the same decode runs as a type (TIQ3_XXS) of the persistent kernel of
  kernels/matvec_persistent.py with 8 rows a CTA (faster than the register kernel there).
reference=True (BackendConfig.reference_kernels) takes the Numba kernels on the GPU too.
"""
import contextlib
import functools

import numpy as np
from numba import cuda, float32

from lite.kernels.dequant_iq import (
    C_HELPERS, _p_iq3_xxs, _p_iq4_xs, _ptr, _v_grid_sign, _v_nonlinear, c_grid_array,
)
from lite.kernels import matvec_cuda, matvec_persistent
from lite.kernels.cuda_source import source
from lite.kernels.iq_tables import KVALUES_IQ4, device_tables
from lite.kernels.reduce import warp_sum
from lite.kernels.registry import quant_info, register_matvec
from lite.kernels.util import SIMULATOR, numba_stream

MAX_N = 8          # x rows a Numba launch handles; more are done in chunks
# The same for CUDA C, per kernel: beyond these the fully unrolled body spills (ptxas -v, sm_90).
C_MAX_N = {"IQ3_XXS": 2, "IQ4_XS": 4}
_ROWS_PER_CTA = 4  # CUDA C kernel


def _make_numba_kernel(param, value):
    @cuda.jit
    def kernel(u8, w16, h16, tab, x, out, rows, cols, n):
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        blocks_per_row = cols // 256
        acc = cuda.local.array(MAX_N, float32)
        for i in range(MAX_N):
            acc[i] = float32(0.0)
        g = t
        while g < cols // 8:
            blk = g // 32
            a, gv, b = param(u8, w16, h16, tab, row * blocks_per_row + blk, g - blk * 32)
            for j in range(8):
                v = value(a, gv, b, j, tab)
                for i in range(n):
                    acc[i] += v * x[i, g * 8 + j]
            g += 32
        for i in range(MAX_N):          # every thread reaches every warp_sum (its contract)
            s = warp_sum(acc[i])
            if t == 0 and i < n:
                out[i, row] = s
    return kernel


NUMBA_KERNELS = {
    "IQ3_XXS": _make_numba_kernel(_p_iq3_xxs, _v_grid_sign),
    "IQ4_XS": _make_numba_kernel(_p_iq4_xs, _v_nonlinear),
}


def launch_numba(name, blocks, x, out, rows, cols, stream):
    views = (blocks, blocks.view(np.uint16), blocks.view(np.float16), device_tables(name))
    # CuPy's current stream must be the launch stream while Numba converts the arrays (it makes
    # the current stream wait on them); otherwise a graph capture on `stream` fails (seen on H200).
    with stream if stream is not None else contextlib.nullcontext():
        for i in range(0, x.shape[0], MAX_N):
            xs = x[i:i + MAX_N]
            NUMBA_KERNELS[name][rows, 32, numba_stream(stream)](
                *views, xs, out[i:i + MAX_N], rows, cols, xs.shape[0])


# ---- CUDA C ------------------------------------------------------------------------------------

C_COMMON = source("matvec_iq_common.cuh")

C_IQ3_XXS = source("matvec_iq3_xxs.cuh")

C_IQ4_XS = source("matvec_iq4_xs.cuh")


# IQ3_XXS as a type of the register loops (matvec_cuda's, the persistent one, the MoE experts'); the
# decode is C_IQ3_XXS's, a thread per sub-block.
C_IQ3_XXS_STAGED = source("iq3_xxs_struct.cuh")
# IQ3_XXS's decode product over float x: the persistent kernel (kernels/matvec_persistent.py) with
# TIQ3_XXS, 8 rows a CTA, for n = 1 (n = 2 spills registers there: mv_iq3xxs, the register kernel).
PERSISTENT_ROWS = 8
# The IQ3_XXS grid copies a CTA fills in shared memory (GCOPIES in C_IQ3_XXS): none, the 1 KB grid is
# read from global memory through L1 (mv_iq3xxs keeps one copy in shared memory).
GRID_COPIES = 0


def grid_copies():
    """GRID_COPIES (kernels/moe_mvw.py's modules define GCOPIES from it)."""
    return GRID_COPIES


def c_source():
    """The module text (kernels/cuda/matvec_iq.cu): the IQ3_XXS grid read through L1 (GCOPIES 0)."""
    return source("matvec_iq.cu")


_C_NAMES = {"IQ3_XXS": "mv_iq3xxs", "IQ4_XS": "mv_iq4xs"}
_STRUCTS = {"IQ3_XXS": "TIQ3_XXS"}


@functools.lru_cache(maxsize=None)
def _raw_module(device, names=None):
    """The kernels named, or without names every register kernel."""
    import cupy
    exprs = list(names or [f"{k}<{n}>" for name, k in _C_NAMES.items() for n in range(1, C_MAX_N[name] + 1)])
    return cupy.RawModule(code=c_source(), options=("--std=c++17",), name_expressions=exprs)


def launch_cuda(name, blocks, x, out, rows, cols, stream, pdl=False, int8_dot_types=matvec_cuda.INT8_DOT_TYPES):
    """IQ3_XXS (and IQ3_XXS_G4) on dp4a over quantized x where int8_dot_types names it (matvec_q8;
    pdl: launched with PDL), else IQ3_XXS's persistent kernel for n = 1 and the register kernels."""
    import cupy
    from lite.kernels import matvec_q8
    if matvec_q8.applies(name, int8_dot_types):      # IQ3_XXS on dp4a over quantized x
        with stream if stream is not None else contextlib.nullcontext():
            for i in range(0, x.shape[0], matvec_q8.C_MAX_N):
                xs = x[i:i + matvec_q8.C_MAX_N]
                matvec_q8.launch(name, blocks, xs, cupy.empty_like(xs), out[i:i + matvec_q8.C_MAX_N], rows, cols, pdl=pdl)
        return
    device = cupy.cuda.runtime.getDevice()
    with stream if stream is not None else contextlib.nullcontext():
        step = C_MAX_N[name]
        for i in range(0, x.shape[0], step):
            xs, os_ = x[i:i + step], out[i:i + step]
            n = xs.shape[0]
            args = (blocks, xs, os_, np.int32(rows), np.int32(cols))
            if name == "IQ3_XXS" and n == 1:
                kname = matvec_persistent.persistent_name(_STRUCTS[name], n, PERSISTENT_ROWS)
                func = _raw_module(device, (kname,)).get_function(kname)
                matvec_persistent.launch(func, 0, device, rows, PERSISTENT_ROWS, args)
                continue
            w = blocks.view(np.uint16 if name == "IQ3_XXS" else np.uint32)
            kern = _raw_module(device).get_function(f"{_C_NAMES[name]}<{n}>")
            kern((-(-rows // _ROWS_PER_CTA),), (128,), (w, xs, os_, np.int32(rows), np.int32(cols)))


def check_args(name, x, out, rows, cols, col_multiple):
    """The launchers' input checks (kernels/iq3_groups.py's too): cols a multiple of col_multiple
    (a block's values, or a group's), C-contiguous float32 x (n, cols) and out (n, rows)."""
    if cols % col_multiple:
        raise ValueError(f"{name} matvec: cols={cols} is not a multiple of {col_multiple}")
    if x.ndim != 2 or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError(f"{name} matvec: x must be a C-contiguous (n, {cols}) float32 array")
    if out.shape != (x.shape[0], rows) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"{name} matvec: out must be a C-contiguous ({x.shape[0]}, {rows}) float32 array")


def _register(name):
    info = quant_info(name)

    @register_matvec(name)
    def launch(blocks, x, out, rows, cols, stream=None, pdl=False, int8_dot_types=matvec_cuda.INT8_DOT_TYPES,
               reference=False):
        check_args(name, x, out, rows, cols, info.block_elems)
        aligned = _ptr(blocks) % (2 if name == "IQ3_XXS" else 8) == 0 and _ptr(x) % 16 == 0
        if not (SIMULATOR or reference) and aligned:
            return launch_cuda(name, blocks, x, out, rows, cols, stream, pdl, int8_dot_types)
        return launch_numba(name, blocks, x, out, rows, cols, stream)
    return launch


for _name in _C_NAMES:
    _register(_name)
