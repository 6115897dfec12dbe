"""Lookup tables of the IQ quant types, built once from gguf-py's format definitions.

gguf-py (gguf.quants) holds each IQ grid as packed constants and expands it into float values
(`init_grid`); here those values are repacked into one integer per grid entry, the form the
kernels read (entry byte j = value j):

  grid_packed(name)  one uint64 per 8-value entry: IQ2_XXS (256), IQ2_XS (512), IQ2_S (1024), values
                     in {8, 25, 43}; IQ1_S / IQ1_M (2048), values -1..1 stored as value + 1;
                     one uint32 per 4-value entry: IQ3_XXS (256), values 4..62; IQ3_S (512), odd 1..15
  KVALUES_IQ4        the 16 non-linear levels of IQ4_NL / IQ4_XS (int32)

The 7-bit sign index of IQ2/IQ3 expands to 8 signs with the eighth making the parity even:
  ksigns[i] = i | (popcount(i) & 1) << 7       (checked against gguf-py's table at build time)
so the kernels compute it rather than read a table.

device_tables(name) uploads a type's tables to the current device once and caches them
(NumPy arrays under the simulator, Numba device arrays on the GPU).
"""
import functools

import numpy as np
from gguf import quants as gq

from lite.errors import UnsupportedQuantError
from lite.kernels.registry import gguf_type
from lite.kernels.util import SIMULATOR

_GRID_CLASS = {
    "IQ2_XXS": gq.IQ2_XXS, "IQ2_XS": gq.IQ2_XS, "IQ2_S": gq.IQ2_S,
    "IQ3_XXS": gq.IQ3_XXS, "IQ3_S": gq.IQ3_S, "IQ1_S": gq.IQ1_S, "IQ1_M": gq.IQ1_M,
}
KVALUES_IQ4 = np.array(gq.IQ4_NL.kvalues, dtype=np.int32)     # (16,)


def ksigns_formula(i):
    """Sign byte for 7-bit sign index i (bit j set: value j is negative)."""
    i = int(i)
    return i | ((bin(i).count("1") & 1) << 7)


@functools.lru_cache(maxsize=None)
def ksigns() -> np.ndarray:
    """(128,) uint8: gguf-py's sign table, verified to equal ksigns_formula."""
    table = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8).copy()
    expect = np.array([ksigns_formula(i) for i in range(128)], dtype=np.uint8)
    if not np.array_equal(table, expect):
        raise AssertionError("gguf-py's ksigns table is not the parity-completed index; "
                             "the IQ kernels assume it is")
    return table


@functools.lru_cache(maxsize=None)
def grid_values(name) -> np.ndarray:
    """(entries, 8 or 4) float32: the grid of an IQ type as gguf-py defines it."""
    try:
        cls = _GRID_CLASS[name]
    except KeyError:
        raise UnsupportedQuantError(f"{name} has no IQ grid") from None
    cls.init_grid()
    return np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)


@functools.lru_cache(maxsize=None)
def grid_packed(name) -> np.ndarray:
    """One integer per grid entry, byte j = value j (+1 for the IQ1 grids, whose values are -1..1)."""
    g = grid_values(name)
    if name in ("IQ1_S", "IQ1_M"):
        g = g + 1
    as_int = g.astype(np.int64)
    if not np.array_equal(as_int, g) or as_int.min() < 0 or as_int.max() > 255:
        raise AssertionError(f"{name} grid values do not fit one byte each")
    packed = np.ascontiguousarray(as_int.astype(np.uint8))
    return packed.view(np.uint64 if g.shape[1] == 8 else np.uint32).reshape(-1)


def _device_key():
    if SIMULATOR:
        return -1
    import cupy
    return cupy.cuda.runtime.getDevice()


@functools.lru_cache(maxsize=None)
def _upload(name, device):
    from lite.kernels.util import as_device
    host = grid_packed(name) if name in _GRID_CLASS else KVALUES_IQ4
    if SIMULATOR:
        return host
    import cupy
    return as_device(cupy.asarray(host))


def device_tables(name):
    """The table a kernel of type `name` reads (grid, or the IQ4 levels), on the current device."""
    if name in ("IQ4_NL", "IQ4_XS"):
        return _upload("IQ4", _device_key())
    return _upload(gguf_type(name), _device_key())   # a regrouped layout: its GGUF type's table


__all__ = ["KVALUES_IQ4", "ksigns", "ksigns_formula", "grid_values", "grid_packed", "device_tables",
           "c_grid_array", "table_words", "C_TABLE_HEADERS"]


# IQ3_XXS in offset binary (the integer-dot products, kernels/matvec_q8.py): grid bytes as
# 64 + g, and per 7 stored sign bits the byte masks of the negative weights.
def grid64():
    """IQ3_XXS grid entries with every byte g replaced by 64 + g (uint32, 256)."""
    return (grid_packed("IQ3_XXS").view(np.uint8) + np.uint8(64)).view(np.uint32)


def sign_masks():
    """(128, 2) uint32: for the 7 stored sign bits, byte j of word h is 0x3F where weight
    4h + j of the group of 8 is negative (ksigns: the 8th bit completes an even parity)."""
    ks = ksigns().astype(np.uint32)
    bits = (ks[:, None] >> np.arange(8, dtype=np.uint32)) & 1
    b = (bits * 0x3F).astype(np.uint8).reshape(128, 8)
    return b.view(np.uint32).reshape(128, 2)


def _c_array(cname, vals):
    return f"__device__ const unsigned {cname}[{vals.size}] = {{{', '.join(f'{int(v):#x}u' for v in vals.reshape(-1))}}};\n"


def c_offset_tables():
    """The CUDA C arrays of grid64 and sign_masks."""
    return _c_array("IQ3XXS_GRID64", grid64()) + _c_array("IQ3XXS_SMASK", sign_masks())


def c_grid_array(cname, name):
    """`__device__ const unsigned <cname>[n] = {...};` generated from the gguf-py grid."""
    vals = ", ".join(f"{int(v):#x}u" for v in grid_packed(name))
    return f"__device__ const unsigned {cname}[{grid_packed(name).size}] = {{{vals}}};\n"


def table_words():
    """The 4096 signed grid words of LT_TAB4096: entry idx | signs << 8, byte i = -g or g (sign bit i)."""
    g = grid_values("IQ3_XXS").astype(np.int64)
    e = np.arange(4096)
    v = np.where((e[:, None] >> (8 + np.arange(4))) & 1, -g[e & 255], g[e & 255]) & 255
    return (v[:, 0] | v[:, 1] << 8 | v[:, 2] << 16 | v[:, 3] << 24).astype(np.uint32)


# The table headers the kernels' CUDA C includes (kernels/cuda_source.py): gguf-py's tables written
# as C arrays when a module's text is made. They are data generated from gguf-py, not hand-written
# CUDA C, so they have no file in kernels/cuda/ (tests/test_kernels_iq.py checks them against gguf-py).
_GENERATED = "// Generated from gguf-py's tables (kernels/iq_tables.py; tests/test_kernels_iq.py checks them).\n"


def _c_iq3_grid():
    return _GENERATED + c_grid_array("IQ3XXS_GRID", "IQ3_XXS")


def _c_iq3_sign_masks():
    masks = ", ".join(f"{{{int(a):#x}u, {int(b):#x}u}}" for a, b in sign_masks())
    return _GENERATED + f"__device__ const uint2 IQ3XXS_SMASK2[128] = {{{masks}}};\n"


def _c_iq4_values():
    return _GENERATED + f"__device__ const int IQ4_KVALUES[16] = {{{', '.join(str(int(v)) for v in KVALUES_IQ4)}}};\n"


def _c_iq3_offset_tables():
    return _GENERATED + c_offset_tables()


def _c_iq3_signed_grid_words():
    words = ", ".join(f"{int(v)}u" for v in table_words())
    return ("// IQ3_XXS's grid words under every 4 signs: entry idx | signs << 8, byte i = -g or g (sign bit i);\n"
            "// generated from gguf-py's grid (kernels/iq_tables.table_words, tests/test_kernels_iq.py).\n"
            f"__device__ const unsigned LT_TAB4096[4096] __attribute__((aligned(16))) = {{{words}}};\n")


C_TABLE_HEADERS = {                  # header name -> its text's generator
    "iq3_grid.cuh": _c_iq3_grid,                            # IQ3XXS_GRID: grid_packed("IQ3_XXS")
    "iq3_sign_masks.cuh": _c_iq3_sign_masks,                # IQ3XXS_SMASK2: sign_masks() as uint2 pairs
    "iq4_values.cuh": _c_iq4_values,                        # IQ4_KVALUES: KVALUES_IQ4
    "iq3_offset_tables.cuh": _c_iq3_offset_tables,          # IQ3XXS_GRID64, IQ3XXS_SMASK: c_offset_tables()
    "iq3_signed_grid_words.cuh": _c_iq3_signed_grid_words,  # LT_TAB4096: table_words()
}
