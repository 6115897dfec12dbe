"""Device kernels (Numba CUDA, a few CuPy RawKernels), each with a host wrapper. Installed as lite.kernels.

Public entry points:
  dequantize(blocks, qtype, out_dtype=float16, stream=None) -> flat array of values
  matvec(blocks, qtype, x, rows, cols, stream=None)         -> (n, rows) f32, fused dequantize-and-dot
Under NUMBA_ENABLE_CUDASIM=1 the same kernels run on NumPy arrays on the host.
"""
import numpy as np

from lite.kernels.util import SIMULATOR
from lite.kernels.matvec_cuda import INT8_DOT_TYPES
from lite.kernels.registry import (
    array_module, dequant_types, get_dequant, get_matvec, matvec_types, quant_info,
)
# Importing a quant module registers its kernels.
from lite.kernels import dequant_basic, dequant_k, dequant_iq, iq3_groups, matvec_basic, matvec_iq, matvec_mma  # noqa: F401


def dequantize(blocks, qtype, out_dtype=np.float16, stream=None, out=None, reference=False):
    """Dequantize whole GGUF blocks on the device.

    blocks: uint8 1-D array of whole blocks (CuPy on the GPU, NumPy under the simulator); a row
    range or one expert of a 3-D tensor is a contiguous byte slice of the tensor's blocks.
    Returns (n_blocks * block_elems,) of out_dtype (float16 or float32). Enqueued on `stream`
    (a CuPy stream); the host is not synchronized. Capturable into a CUDA graph. reference: the
    Numba kernels on a GPU too (BackendConfig.reference_kernels).
    """
    info, launch = get_dequant(qtype)
    if blocks.dtype != np.uint8 or blocks.ndim != 1:
        raise ValueError(f"blocks must be a 1-D uint8 array, got {blocks.dtype} {blocks.shape}")
    if blocks.size % info.type_size:
        raise ValueError(f"{blocks.size} bytes is not a whole number of {info.name} blocks "
                         f"({info.type_size} bytes each)")
    out_dtype = np.dtype(out_dtype)
    if out_dtype not in (np.float16, np.float32):
        raise ValueError(f"out_dtype must be float16 or float32, got {out_dtype}")
    n = blocks.size // info.type_size * info.block_elems
    xp = array_module(blocks)
    if out is None:
        out = xp.empty(n, dtype=out_dtype)
    elif out.shape != (n,) or out.dtype != out_dtype:
        raise ValueError(f"out must be ({n},) {out_dtype}, got {out.shape} {out.dtype}")
    if n:
        launch(blocks, out, stream, reference=reference)
    return out


def matvec(blocks, qtype, x, rows, cols, stream=None, out=None, pdl=False, int8_dot_types=INT8_DOT_TYPES,
           reference=False):
    """out (n, rows) f32 = x (n, cols) f32 @ W.T, W (rows, cols) given as GGUF blocks; fp32 accumulation.
    pdl: launched with programmatic dependent launch; int8_dot_types: the types whose products run on
    dp4a over quantized x; reference: the Numba kernels on a GPU too (BackendConfig's fields).

    Raises UnsupportedQuantError for a type with no fused kernel (callers dequantize + GEMM).
    """
    from lite.errors import UnsupportedQuantError
    info = quant_info(qtype)
    launch = get_matvec(info.name)
    if launch is None:
        raise UnsupportedQuantError(f"no fused matvec kernel for quant type {info.name}")
    if cols % info.block_elems or blocks.size != rows * cols // info.block_elems * info.type_size:
        raise ValueError(f"blocks of {blocks.size} bytes do not hold a {rows}x{cols} {info.name} matrix")
    squeeze = x.ndim == 1
    x2 = x.reshape(1, -1) if squeeze else x
    if x2.shape[1] != cols or x2.dtype != np.float32:
        raise ValueError(f"x must be (n, {cols}) float32, got {x.shape} {x.dtype}")
    xp = array_module(blocks)
    if out is None:
        out = xp.empty((x2.shape[0], rows), dtype=np.float32)
    launch(blocks, x2, out, rows, cols, stream, pdl=pdl, int8_dot_types=int8_dot_types, reference=reference)
    return out[0] if squeeze else out


__all__ = ["dequantize", "matvec", "dequant_types", "matvec_types", "quant_info", "SIMULATOR"]
