"""Fused dequantize-and-dot for IQ3_XXS and IQ4_XS: out (n, rows) f32 = x (n, cols) f32 @ W.T.

Two implementations of the same product:
- Numba (the reference, what CI runs under the simulator): one 32-thread block per row, a thread
  per group of 8 weights decoded by dequant_iq's per-type functions (so the decode is the one
  checked bit for bit against gguf-py), fp32 accumulation, util.warp_sum across the row.
- CUDA C (the GPU path, a CuPy RawModule): a 128-thread block per 4 rows, a thread per 32-weight
  sub-block. The x chunk a thread loads is reused for all 4 rows (x is 32 bits a weight against
  3-4.25 bits of weight, so without reuse x traffic would swamp L1); the sub-block scale
  multiplies once per 32 weights. IQ3_XXS: the grid as packed bytes, read through L1 (matvec_iq3_xxs: one
  copy in shared memory; a float4 grid and a sign-mask table there were bound by bank conflicts of
  random 16-byte gathers); bytes become
  floats by the 2^23 exponent trick (PRMT + FADD, not the slow I2F unit), signs flip x's sign bit.
  Templated on n (up to C_MAX_N, larger n in chunks) so the accumulators stay in registers.
  For IQ3_XXS and n = 1 the same decode runs as a type (Iq3XxsBlock) of the persistent kernel
  `matvec_persistent` with 8 rows a CTA (faster than the register kernel there; the K types' register
  kernel `matvec_rows` beat it): matvec_cuda's register loop on a grid of as many CTAs as fit the
  device at once, each walking row groups blockIdx.x, +gridDim.x, ... and loading the next item
  (row group, trip) into registers before computing this one, across row groups too.
reference=True (BackendConfig.reference_kernels) takes the Numba kernels on the GPU too.
"""
import contextlib
import functools

import numpy as np
from numba import cuda, float32

from lite.kernels.dequant_iq import (
    C_HELPERS, _p_iq3_xxs, _p_iq4_xs, _ptr, _v_grid_sign, _v_nonlinear, c_grid_array,
)
from lite.kernels import matvec_cuda
from lite.kernels.cuda_source import includes, source
from lite.kernels.iq_tables import KVALUES_IQ4, device_tables
from lite.kernels.registry import quant_info, register_matvec
from lite.kernels.util import SIMULATOR, numba_stream, warp_sum

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
# IQ3_XXS's decode product over float x: the persistent kernel (matvec_persistent, below) with
# Iq3XxsBlock, 8 rows a CTA, for n = 1 (n = 2 spills registers there: matvec_iq3_xxs, the register kernel).
PERSISTENT_ROWS = 8
# The IQ3_XXS grid copies a CTA fills in shared memory (GCOPIES in C_IQ3_XXS): none, the 1 KB grid is
# read from global memory through L1 (matvec_iq3_xxs keeps one copy in shared memory).
GRID_COPIES = 0


def grid_copies():
    """GRID_COPIES (kernels/moe_products.py's modules define GCOPIES from it)."""
    return GRID_COPIES


def c_source():
    """The module text: the IQ3_XXS grid read through L1 (GCOPIES 0); IQ3_XXS's and IQ4_XS's decode products over
    float x: the register kernels matvec_iq3_xxs / matvec_iq4_xs, and IQ3_XXS's struct on the persistent loop (matvec_persistent)."""
    return includes("iq_helpers.cuh", "iq3_grid.cuh", "iq4_values.cuh", "matvec_common.cuh", "matvec_persistent.cuh",
                    "matvec_iq_common.cuh", "matvec_iq3_xxs.cuh", "matvec_iq4_xs.cuh", "iq3_xxs_struct.cuh")


_C_NAMES = {"IQ3_XXS": "matvec_iq3_xxs", "IQ4_XS": "matvec_iq4_xs"}
_STRUCTS = {"IQ3_XXS": "Iq3XxsBlock"}


@functools.lru_cache(maxsize=None)
def _raw_module(device, names=None):
    """The kernels named, or without names every register kernel."""
    import cupy
    exprs = list(names or [f"{k}<{n}>" for name, k in _C_NAMES.items() for n in range(1, C_MAX_N[name] + 1)])
    return cupy.RawModule(code=c_source(), options=("--std=c++17",), name_expressions=exprs)


# ---- the persistent kernel matvec_persistent ---------------------------------------------------

PERSISTENT_THREADS = 128

C_PERSISTENT = source("matvec_persistent.cuh")


def persistent_name(struct, n, rows_per_cta):
    return f"matvec_persistent<{struct}, {n}, {rows_per_cta}>"


def _persistent_blocks_per_sm(func, smem, device):
    import cupy
    try:
        return max(1, cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(func.ptr, PERSISTENT_THREADS, smem))
    except Exception:   # noqa: BLE001 - no such call in this CuPy: registers and shared memory bound it
        props = cupy.cuda.runtime.getDeviceProperties(device)
        by_smem = props.get("sharedMemPerMultiprocessor", 233472) // (smem + func.shared_size_bytes + 1024)
        regs = -(-func.num_regs * 32 // 256) * 256 * (PERSISTENT_THREADS // 32)
        return max(1, min(by_smem, 65536 // max(regs, 1), 2048 // PERSISTENT_THREADS))


@functools.lru_cache(maxsize=None)
def persistent_prepare(func, smem, device):
    """Allows `func` its dynamic shared memory; returns the persistent grid's size cap (CTAs that
    fit on the device at once)."""
    import cupy
    if smem > 48 * 1024:
        func.max_dynamic_shared_size_bytes = smem
    if smem:   # ask for the largest shared-memory carveout, or fewer CTAs than computed may fit
        func.preferred_shared_memory_carveout = 100
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    return sms * _persistent_blocks_per_sm(func, smem, device)


def persistent_launch(func, smem, device, rows, rows_per_cta, args):
    """Enqueue one persistent kernel on the current CuPy stream (smem: its dynamic shared memory)."""
    cap = persistent_prepare(func, smem, device)
    grid = max(1, min(-(-rows // rows_per_cta), cap))
    func((grid,), (PERSISTENT_THREADS,), args, shared_mem=smem)


# ---- launchers -----------------------------------------------------------------------------------

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
                kname = persistent_name(_STRUCTS[name], n, PERSISTENT_ROWS)
                func = _raw_module(device, (kname,)).get_function(kname)
                persistent_launch(func, 0, device, rows, PERSISTENT_ROWS, args)
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
