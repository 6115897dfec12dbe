"""Dequantize kernels for the IQ types: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS.

One thread makes one group of 8 consecutive values. Every type reduces a group to three things
(a "param" device function per type), and one of three value rules turns them into 8 floats:
  grid-sign   (IQ2_*, IQ3_*):  v_j = (db * grid_byte_j) * (-1 if sign bit j else 1)
  grid-delta  (IQ1_*):         v_j = dl * ((grid_byte_j - 1) + delta)
  non-linear  (IQ4_*):         v_j = dl * kvalues[nibble_j]
in the same float32 operation order as gguf-py, so fp32 output equals it exactly and fp16 output
is its round-to-nearest cast. fp16 values are packed four to a uint64 store (wide stores are what
let a dequant kernel approach copy bandwidth; shared device notes).

Block bytes are read through three views of the same memory: uint8, uint16 and float16 (every
IQ block size is even, so 16-bit fields stay aligned).

On the GPU, IQ3_XXS (and IQ3_XXS_G4, its blocks regrouped by kernels/iq3_groups.py) runs a CUDA C
kernel (iq3_launch_cuda below: 16-byte stores, grid in shared memory, several times faster than
Numba's). Its Numba twin is what CI checks under the simulator; the device benchmark
checks the CUDA C kernel against the Numba one.
"""
import contextlib
import functools

import numpy as np
from numba import cuda, float32, uint32, uint64

from lite.kernels.cuda_source import includes, source
from lite.kernels.dequant_common import _ptr
from lite.kernels.iq_tables import c_grid_array, device_tables  # noqa: F401  (c_grid_array: others read it here)
from lite.kernels.registry import quant_info, register_dequant
from lite.kernels.util import SIMULATOR, numba_stream

_TPB = 256


@cuda.jit(device=True, inline=True)
def _f16_bits(v):
    return uint64(np.float16(v).view(np.uint16))


@cuda.jit(device=True, inline=True)
def _f32_from_f16_bits(b):
    # Numba cannot view a uint16 scalar as float16, but it can view uint32 as float32: widen by hand.
    b = uint32(b)
    sign = (b & uint32(0x8000)) << uint32(16)
    e = (b >> uint32(10)) & uint32(31)
    m = b & uint32(1023)
    if e == uint32(0):                       # zero or subnormal: m * 2^-24, exact in float32
        v = float32(m) * float32(5.9604644775390625e-08)
        return -v if sign else v
    if e == uint32(31):
        bits = sign | uint32(0x7F800000) | (m << uint32(13))
    else:
        bits = sign | ((e + uint32(112)) << uint32(23)) | (m << uint32(13))
    return uint32(bits).view(np.float32)


@cuda.jit(device=True, inline=True)
def _ksign(s7):
    # 7 stored sign bits + an eighth that makes the count even (== gguf-py's ksigns table)
    s7 = uint32(s7)
    return s7 | ((uint32(cuda.popc(s7)) & uint32(1)) << uint32(7))


@cuda.jit(device=True, inline=True)
def _byte(v, j):
    return (uint64(v) >> uint64(8 * j)) & uint64(255)


@cuda.jit(device=True, inline=True)
def _u32(w16, i):
    return uint32(w16[i]) | (uint32(w16[i + 1]) << uint32(16))


# ---- value rules -------------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def _v_grid_sign(a, gv, b, j, tab):
    v = a * float32(_byte(gv, j))
    if (uint32(b) >> uint32(j)) & uint32(1):
        return v * float32(-1.0)
    return v * float32(1.0)


@cuda.jit(device=True, inline=True)
def _v_grid_delta(a, gv, b, j, tab):
    return a * (float32(np.int32(_byte(gv, j)) - np.int32(1)) + b)


@cuda.jit(device=True, inline=True)
def _v_nonlinear(a, gv, b, j, tab):
    return a * float32(tab[_byte(gv, j)])


# ---- per-type parameters of group g (0..groups-1) of block blk --------------------------------
# Each returns (scale a: float32, gv: uint64 of 8 bytes, b: sign byte or delta).

@cuda.jit(device=True, inline=True)
def _p_iq2_xxs(u8, w16, h16, tab, blk, g):
    base = blk * 66
    hb = blk * 33
    ib = g >> 2
    aux1 = _u32(w16, hb + 3 + 4 * ib)
    db = float32(h16[hb]) * (float32(0.5) + float32(aux1 >> uint32(28))) * float32(0.25)
    idx = u8[base + 2 + 8 * ib + (g & 3)]
    return db, uint64(tab[idx]), _ksign((aux1 >> uint32(7 * (g & 3))) & uint32(127))


@cuda.jit(device=True, inline=True)
def _p_iq2_xs(u8, w16, h16, tab, blk, g):
    base = blk * 74
    q = uint32(w16[blk * 37 + 1 + g])
    ls = (uint32(u8[base + 66 + (g >> 2)]) >> uint32(4 * ((g >> 1) & 1))) & uint32(15)
    db = float32(h16[blk * 37]) * (float32(0.5) + float32(ls)) * float32(0.25)
    return db, uint64(tab[q & uint32(511)]), _ksign(q >> uint32(9))


@cuda.jit(device=True, inline=True)
def _p_iq2_s(u8, w16, h16, tab, blk, g):
    base = blk * 82
    hi = (uint32(u8[base + 66 + (g >> 2)]) >> uint32(2 * (g & 3))) & uint32(3)
    idx = uint32(u8[base + 2 + g]) | (hi << uint32(8))
    ls = (uint32(u8[base + 74 + (g >> 2)]) >> uint32(4 * ((g >> 1) & 1))) & uint32(15)
    db = float32(h16[blk * 41]) * (float32(0.5) + float32(ls)) * float32(0.25)
    return db, uint64(tab[idx]), uint32(u8[base + 34 + g])


@cuda.jit(device=True, inline=True)
def _p_iq3_xxs(u8, w16, h16, tab, blk, g):
    base = blk * 98
    hb = blk * 49
    ib = g >> 2
    aux = _u32(w16, hb + 33 + 2 * ib)
    db = float32(h16[hb]) * (float32(0.5) + float32(aux >> uint32(28))) * float32(0.5)
    gv = uint64(tab[u8[base + 2 + 2 * g]]) | (uint64(tab[u8[base + 3 + 2 * g]]) << uint64(32))
    return db, gv, _ksign((aux >> uint32(7 * (g & 3))) & uint32(127))


@cuda.jit(device=True, inline=True)
def _p_iq3_xxs_g4(u8, w16, h16, tab, blk, g):
    # IQ3_XXS_G4 (kernels/iq3_groups.py): 4 blocks as 408 bytes, [4 x 64 index bytes][32 sign
    # words: chunk c's weight 4w + i at bit 8i + w][4 scale words: chunk 8k + c at bits 4c][4 d];
    # block blk is number blk & 3 of its four
    base = (blk >> 2) * 408
    k = blk & 3
    ib = g >> 2
    s32 = _u32(w16, (base + 256 + 4 * (8 * k + ib)) >> 1)
    l = g & 3
    sb = uint32(0)
    for j in range(8):
        sb |= ((s32 >> uint32(8 * (j & 3) + 2 * l + (j >> 2))) & uint32(1)) << uint32(j)
    scale = (_u32(w16, (base + 384 + 4 * k) >> 1) >> uint32(4 * ib)) & uint32(15)
    db = float32(h16[(base + 400 + 2 * k) >> 1]) * (float32(0.5) + float32(scale)) * float32(0.5)
    q = base + 64 * k + 2 * g
    gv = uint64(tab[u8[q]]) | (uint64(tab[u8[q + 1]]) << uint64(32))
    return db, gv, sb


@cuda.jit(device=True, inline=True)
def _iq3s_index(u8, base, t):
    hi = (uint32(u8[base + 66 + (t >> 3)]) >> uint32(t & 7)) & uint32(1)
    return uint32(u8[base + 2 + t]) | (hi << uint32(8))


@cuda.jit(device=True, inline=True)
def _p_iq3_s(u8, w16, h16, tab, blk, g):
    base = blk * 110
    ib = g >> 2
    sc = (uint32(u8[base + 106 + (ib >> 1)]) >> uint32(4 * (ib & 1))) & uint32(15)
    db = float32(h16[blk * 55]) * float32(uint32(1) + uint32(2) * sc)
    gv = uint64(tab[_iq3s_index(u8, base, 2 * g)]) | \
        (uint64(tab[_iq3s_index(u8, base, 2 * g + 1)]) << uint64(32))
    return db, gv, uint32(u8[base + 74 + g])


@cuda.jit(device=True, inline=True)
def _p_iq1_s(u8, w16, h16, tab, blk, g):
    base = blk * 50
    qh = uint32(w16[blk * 25 + 17 + (g >> 2)])
    idx = uint32(u8[base + 2 + g]) | (((qh >> uint32(3 * (g & 3))) & uint32(7)) << uint32(8))
    dl = float32(h16[blk * 25]) * float32(uint32(2) * ((qh >> uint32(12)) & uint32(7)) + uint32(1))
    delta = float32(-0.125) if qh & uint32(0x8000) else float32(0.125)
    return dl, uint64(tab[idx]), delta


@cuda.jit(device=True, inline=True)
def _p_iq1_m(u8, w16, h16, tab, blk, g):
    base = blk * 56
    hb = blk * 28 + 24          # four uint16 scale words at byte 48
    dbits = (uint32(w16[hb]) >> uint32(12)) | ((uint32(w16[hb + 1]) >> uint32(8)) & uint32(0xF0)) | \
        ((uint32(w16[hb + 2]) >> uint32(4)) & uint32(0xF00)) | (uint32(w16[hb + 3]) & uint32(0xF000))
    d = _f32_from_f16_bits(dbits)
    s = g >> 1                  # one 3-bit scale per 16 values
    sc = (uint32(w16[hb + (s >> 2)]) >> uint32(3 * (s & 3))) & uint32(7)
    dl = d * float32(uint32(2) * sc + uint32(1))
    qh = uint32(u8[base + 32 + (g >> 1)]) >> uint32(4 * (g & 1))
    idx = uint32(u8[base + g]) | ((qh & uint32(7)) << uint32(8))
    delta = float32(-0.125) if qh & uint32(8) else float32(0.125)
    return dl, uint64(tab[idx]), delta


@cuda.jit(device=True, inline=True)
def _nibbles8(u8, at, shift):
    gv = uint64(0)
    for j in range(8):
        gv |= ((uint64(u8[at + j]) >> uint64(shift)) & uint64(15)) << uint64(8 * j)
    return gv


@cuda.jit(device=True, inline=True)
def _p_iq4_nl(u8, w16, h16, tab, blk, g):
    # value j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j - 16]
    gv = _nibbles8(u8, blk * 18 + 2 + 8 * (g & 1), 4 * (g >> 1))
    return float32(h16[blk * 9]), gv, uint32(0)


@cuda.jit(device=True, inline=True)
def _p_iq4_xs(u8, w16, h16, tab, blk, g):
    base = blk * 136
    ib = g >> 2
    lo = (uint32(u8[base + 4 + (ib >> 1)]) >> uint32(4 * (ib & 1))) & uint32(15)
    hi = (uint32(w16[blk * 68 + 1]) >> uint32(2 * ib)) & uint32(3)
    ls = np.int32(lo | (hi << uint32(4))) - np.int32(32)
    dl = float32(h16[blk * 68]) * float32(ls)
    gv = _nibbles8(u8, base + 8 + 16 * ib + 8 * (g & 1), 4 * ((g >> 1) & 1))
    return dl, gv, uint32(0)


# ---- kernels -----------------------------------------------------------------------------------

def _make_kernels(param, value, groups):
    """(fp16 kernel writing 2 uint64 per thread, fp32 kernel) for one type."""
    @cuda.jit
    def k16(u8, w16, h16, tab, out64, n_groups):
        t = cuda.grid(1)
        if t < n_groups:
            blk = t // groups
            a, gv, b = param(u8, w16, h16, tab, blk, t - blk * groups)
            lo = uint64(0)
            hi = uint64(0)
            for j in range(4):
                lo |= _f16_bits(value(a, gv, b, j, tab)) << uint64(16 * j)
                hi |= _f16_bits(value(a, gv, b, j + 4, tab)) << uint64(16 * j)
            out64[2 * t] = lo
            out64[2 * t + 1] = hi

    @cuda.jit
    def k32(u8, w16, h16, tab, out, n_groups):
        t = cuda.grid(1)
        if t < n_groups:
            blk = t // groups
            a, gv, b = param(u8, w16, h16, tab, blk, t - blk * groups)
            for j in range(8):
                out[8 * t + j] = value(a, gv, b, j, tab)

    return k16, k32


_TYPES = {   # name: (param function, value rule, groups of 8 per block)
    "IQ2_XXS": (_p_iq2_xxs, _v_grid_sign, 32), "IQ2_XS": (_p_iq2_xs, _v_grid_sign, 32),
    "IQ2_S": (_p_iq2_s, _v_grid_sign, 32), "IQ3_XXS": (_p_iq3_xxs, _v_grid_sign, 32),
    "IQ3_XXS_G4": (_p_iq3_xxs_g4, _v_grid_sign, 32),
    "IQ3_S": (_p_iq3_s, _v_grid_sign, 32), "IQ1_S": (_p_iq1_s, _v_grid_delta, 32),
    "IQ1_M": (_p_iq1_m, _v_grid_delta, 32), "IQ4_NL": (_p_iq4_nl, _v_nonlinear, 4),
    "IQ4_XS": (_p_iq4_xs, _v_nonlinear, 32),
}
KERNELS = {name: _make_kernels(p, v, g) for name, (p, v, g) in _TYPES.items()}


def _check_aligned(a, nbytes, what):
    ptr = _ptr(a)
    if ptr % nbytes:
        raise ValueError(f"{what} must be {nbytes}-byte aligned (got address {ptr:#x}); "
                         "pass a fresh array or a slice starting at an aligned offset")


def launch_numba(name, blocks, out, stream):
    """Enqueue the Numba kernel of `name` (the reference implementation, and the GPU path of all
    types but the ones with a CUDA C kernel)."""
    info = quant_info(name)
    _, _, groups = _TYPES[name]
    n_groups = blocks.size // info.type_size * groups
    _check_aligned(blocks, 2, "blocks")
    k16, k32 = KERNELS[name]
    if out.dtype == np.float16:
        _check_aligned(out, 8, "out")
        kernel, dst = k16, out.view(np.uint64)
    elif out.dtype == np.float32:
        kernel, dst = k32, out
    else:
        raise ValueError(f"out must be float16 or float32, got {out.dtype}")
    tpb = min(_TPB, -(-n_groups // 32) * 32)
    grid = -(-n_groups // tpb)
    # CuPy's current stream must be the launch stream while Numba converts the arrays (it makes
    # the current stream wait on them); otherwise a graph capture on `stream` fails (seen on H200).
    with stream if stream is not None else contextlib.nullcontext():
        kernel[grid, tpb, numba_stream(stream)](
            blocks, blocks.view(np.uint16), blocks.view(np.float16), device_tables(name), dst, n_groups)


# ---- CUDA C helpers (IQ3_XXS's CUDA C dequantize below, the IQ matvec kernels) ---------------

C_HELPERS = source("iq_helpers.cuh")


# ---- IQ3_XXS's dequantize on the GPU in CUDA C ------------------------------------------------
# A CuPy RawModule (kernels/cuda/dequant_iq3_xxs.cuh): 16-byte stores, the grid in shared memory, several
# times faster than the Numba kernels. The same float operations as gguf-py, so fp32 output equals it and
# fp16 output is its round-to-nearest cast; the Numba kernels above are the reference CI checks under the
# simulator (and tests/test_kernels_iq.py runs this text on the host).
# Two layouts: IQ3_XXS as the file has it, and IQ3_XXS_G4 (kernels/iq3_groups.py: a row's blocks by
# fours, each field together, the signs re-encoded whole and the scales in words of their own, 408
# bytes a group of 4 blocks), which the decode products of the GPU backend read faster; the
# prefill's dequantize then reads that layout too. The MoE prefill's gathered dequantize
# (iq3xxs_gather_f16) reads the file's layout only (experts are never regrouped).

C_IQ3_XXS_DEQUANT = source("dequant_iq3_xxs.cuh")   # (after the half helpers and the grid)


def iq3_cuda_source():
    """The module: the half helpers, the grid, then the kernels (the file's layout and IQ3_XXS_G4)."""
    return includes("iq_helpers.cuh", "iq3_grid.cuh", "dequant_iq3_xxs.cuh")


@functools.lru_cache(maxsize=None)
def _iq3_module(device):
    import cupy
    mod = cupy.RawModule(code=iq3_cuda_source(), options=("--std=c++17",))
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    return mod, sms


IQ3_GATHER_TILE = 2048      # values a block of iq3xxs_gather_f16
IQ3_ALIGN = {False: 2, True: 4}     # the blocks' alignment iq3_launch_cuda() needs: the file's layout, IQ3_XXS_G4


def iq3_gather_kernel(device, reference=False):
    """(iq3xxs_gather_f16, values a block) for kernels/moe_layer.py's gathered dequantize; None where the
    Numba kernels serve IQ3_XXS (reference, the simulator)."""
    return None if SIMULATOR or reference else (_iq3_module(device)[0].get_function("iq3xxs_gather_f16"), IQ3_GATHER_TILE)


def iq3_launch_cuda(blocks, out, stream, grouped=False):
    """The CUDA C IQ3_XXS dequant (grouped: of IQ3_XXS_G4 blocks, whole groups of four); needs
    2-aligned blocks (grouped: 4-aligned, IQ3_ALIGN) and a 16-aligned out."""
    import cupy
    mod, sms = _iq3_module(cupy.cuda.runtime.getDevice())
    n_groups = blocks.size // quant_info("IQ3_XXS_G4" if grouped else "IQ3_XXS").type_size * 32
    grid = max(1, min(-(-n_groups // 256), sms * 8))
    name = f"iq3xxs{'_g4' if grouped else ''}_deq_{'f16' if out.dtype == np.float16 else 'f32'}"
    with stream if stream is not None else contextlib.nullcontext():
        mod.get_function(name)((grid,), (256,), (blocks, out, np.int64(n_groups)))


def _register(name):
    @register_dequant(name)
    def launch(blocks, out, stream, reference=False):
        if name == "IQ3_XXS_G4" and blocks.size % (group := 4 * quant_info(name).type_size):
            raise ValueError(f"IQ3_XXS_G4 blocks come in groups of four ({group} bytes; kernels/iq3_groups.py), "
                             f"got {blocks.size} bytes")
        if name.startswith("IQ3_XXS") and not (SIMULATOR or reference) and _ptr(out) % 16 == 0:
            grouped = name == "IQ3_XXS_G4"
            if _ptr(blocks) % IQ3_ALIGN[grouped] == 0:
                return iq3_launch_cuda(blocks, out, stream, grouped=grouped)
        return launch_numba(name, blocks, out, stream)
    return launch


for _name in _TYPES:
    _register(_name)
