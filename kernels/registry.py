"""Registry of device kernels by GGUF quant type, and the public entry points.

Each quant module registers a *launcher* per type:
  dequant launcher:  launch(blocks_u8, out, stream, reference=False)
                     blocks (n_blocks*type_size,) uint8, out (n_blocks*block_elems,) f16/f32
  matvec launcher:   launch(blocks_u8, x, out, rows, cols, stream, pdl=False, int8_dot_types=..., reference=False)
                     weight (rows, cols) as blocks; x (n, cols) f32; out (n, rows) f32
The keywords are the backend's settings passed down (BackendConfig): PDL on the launches, the types
on dp4a over quantized x, the Numba twins instead of the CUDA C kernels.
Launchers own their launch configuration and enqueue on `stream` without synchronizing the host.
"""
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from lite.errors import UnsupportedQuantError


@dataclass(frozen=True)
class QuantInfo:
    name: str          # GGUF spelling, e.g. "Q4_K"
    block_elems: int   # values per block
    type_size: int     # bytes per block


# Layouts of a GGUF type's blocks that only the GPU backend makes, by a name of their own so that
# the kernels that read them are found by it: name -> (the GGUF type, bytes a block).
# IQ3_XXS_G4 (kernels/iq3_groups.py): a row's IQ3_XXS blocks by fours, each field together, the
# signs placed for the decode kernels (408 bytes a group of 4 blocks). IQ3_XXS_B16 (kernels/matvec_mma.py):
# bands of 16 rows laid out for the int8 mma's fragments (1632 bytes a band and block of 256 columns).
GPU_LAYOUTS = {"IQ3_XXS_G4": ("IQ3_XXS", 102), "IQ3_XXS_B16": ("IQ3_XXS", 102)}


def gguf_type(name):
    """The GGUF type a GPU layout name stands for (GPU_LAYOUTS), else the name itself."""
    return GPU_LAYOUTS.get(name, (name,))[0]


def quant_info(qtype) -> QuantInfo:
    """QuantInfo for a type given by name ("Q4_K"), GGMLQuantizationType, or its integer id; also
    the GPU_LAYOUTS names (their GGUF type's values a block, their own bytes a block)."""
    if isinstance(qtype, str) and qtype.upper() in GPU_LAYOUTS:
        base_type, type_size = GPU_LAYOUTS[qtype.upper()]
        return QuantInfo(qtype.upper(), quant_info(base_type).block_elems, type_size)
    try:
        if isinstance(qtype, str):
            t = GGMLQuantizationType[qtype.upper()]
        else:
            t = GGMLQuantizationType(int(qtype))
    except (KeyError, ValueError):
        raise UnsupportedQuantError(f"unknown GGUF quant type {qtype!r}") from None
    block_elems, type_size = GGML_QUANT_SIZES[t]
    return QuantInfo(t.name, block_elems, type_size)


_DEQUANT: dict[str, Callable] = {}
_MATVEC: dict[str, Callable] = {}


def register_dequant(*names):
    def deco(launch):
        for n in names:
            _DEQUANT[n] = launch
        return launch
    return deco


def register_matvec(*names):
    def deco(launch):
        for n in names:
            _MATVEC[n] = launch
        return launch
    return deco


def dequant_types():
    return sorted(_DEQUANT)


def matvec_types():
    return sorted(_MATVEC)


def get_dequant(qtype) -> tuple[QuantInfo, Callable]:
    info = quant_info(qtype)
    if info.name not in _DEQUANT:
        raise UnsupportedQuantError(f"no GPU dequantize kernel for quant type {info.name}")
    return info, _DEQUANT[info.name]


def get_matvec(qtype):
    """The fused launcher for a type, or None where the caller must dequantize + GEMM."""
    return _MATVEC.get(quant_info(qtype).name)


def array_module(a):
    """cupy for device arrays, numpy otherwise (the CUDA simulator works on host arrays)."""
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np
