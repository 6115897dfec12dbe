"""IQ3_XXS_B16: IQ3_XXS matrices in bands of 16 rows made for the int8 mma's fragments, what
kernels/matvec_mma.py's bands16_product reads and `dequantize` (below) turns back into rows; `repack` makes it from the file's
blocks (NumPy or CuPy).

IQ3_XXS_B16: rows a multiple of 16, cols of 256. Band b (rows 16b..16b+15), block j (columns 256j..)
is a record of 1632 bytes: [3 planes x 32 lanes x 16 bytes][8 x (scale word of row g, of row g + 8)]
[8 x (d of row g, d of row g + 8) as f16]. A plane holds every lane's words 4p..4p+3 of 12. Lane
4g + q's words, for its 4 words of a chunk, k = 0 (row g, grid word q), 1 (row g + 8, word q), 2 (row
g, word q + 4), 3 (row g + 8, word q + 4), and n = 4 (c / 2) + k: words 0-5 the even chunks' 12-bit
fields (grid index | the word's 4 signs << 8) one after another, field n at bit 12 n; words 6-9 the
odd chunks' grid indices (word 6 + c / 2, byte k); words 10-11 their signs (weight t's at bit n % 8 +
8 t of word 10 + n / 8). A scale word: chunk c's scale nibble at bits 4c. Same bytes as IQ3_XXS_G4
(102 a block; the file's 98 + 4: all 8 signs of a pair of words, the file keeps 7 and a parity).
"""
import contextlib
import functools

import numpy as np

from lite.kernels import iq_tables
from lite.kernels.cuda_source import includes, source
from lite.kernels.registry import array_module

NAME = "IQ3_XXS_B16"
RECORD = 1632                 # bytes a band of 16 rows and block of 256 columns


def nbytes(rows, cols):
    return rows // 16 * cols // 256 * RECORD


def fits(rows, cols):
    """Can a rows x cols matrix take this layout (whole bands of 16 rows, whole blocks of 256 columns)?"""
    return rows % 16 == 0 and cols % 256 == 0


def check_shape(rows, cols):
    if not fits(rows, cols):
        raise ValueError(f"{NAME}: rows must be a multiple of 16 and cols of 256 (got {rows}x{cols})")


def repack(blocks, rows, cols):
    """IQ3_XXS blocks (uint8, rows x cols/256 blocks of 98 bytes, NumPy or CuPy) as IQ3_XXS_B16 records."""
    check_shape(rows, cols)
    xp = array_module(blocks)
    bands, nblk = rows // 16, cols // 256
    b = blocks.reshape(rows, nblk, 98)
    idx = b[..., 2:66].astype(xp.uint32).reshape(rows, nblk, 8, 8)                  # row, block, chunk, word
    aux = xp.ascontiguousarray(b[..., 66:98]).view(xp.uint32).reshape(rows, nblk, 8)
    ks = xp.asarray(iq_tables.ksigns().astype(np.uint32))
    w = xp.arange(8, dtype=xp.uint32)
    s8 = ks[(aux[..., None] >> (7 * (w >> 1))) & 127]                                # the pair's 8 signs
    field = idx | (((s8 >> (4 * (w & 1))) & 15) << 8)                                # row, block, chunk, word
    field = field.reshape(bands, 16, nblk, 8, 8)
    lanes = np.arange(32)
    g, q = lanes >> 2, lanes & 3
    words = xp.zeros((bands, nblk, 32, 12), xp.uint32)
    for cp in range(4):                 # chunk pair 2 cp, 2 cp + 1: field n = 4 cp + k of each
        for k in range(4):
            n = 4 * cp + k
            fe, fo = (field[:, g + 8 * (k & 1), :, c, q + 4 * (k >> 1)].transpose(1, 2, 0) for c in (2 * cp, 2 * cp + 1))
            wi, sh = (12 * n) >> 5, (12 * n) & 31               # the even chunk's 12-bit field: words 0-5
            words[..., wi] |= fe << sh
            if sh > 20:
                words[..., wi + 1] |= fe >> (32 - sh)
            words[..., 6 + cp] |= (fo & 255) << (8 * k)          # the odd chunk's grid index: words 6-9
            for t in range(4):                                   # and its signs: words 10-11
                words[..., 10 + (n >> 3)] |= ((fo >> (8 + t)) & 1) << ((n & 7) + 8 * t)
    planes = words.reshape(bands, nblk, 32, 3, 4).transpose(0, 1, 3, 2, 4).reshape(bands, nblk, 384)
    scw = xp.zeros((rows, nblk), xp.uint32)
    for c in range(8):
        scw |= (aux[..., c] >> 28) << (4 * c)
    scw = scw.reshape(bands, 16, nblk).transpose(0, 2, 1)
    sc = xp.stack([scw[..., :8], scw[..., 8:]], axis=-1).reshape(bands, nblk, 16)
    d = xp.ascontiguousarray(b[..., 0:2]).view(xp.uint16).astype(xp.uint32).reshape(bands, 16, nblk).transpose(0, 2, 1)
    dd = d[..., :8] | (d[..., 8:] << 16)
    return xp.ascontiguousarray(xp.concatenate([planes, sc, dd], axis=2)).view(xp.uint8).reshape(-1)


# --- dequantized to rows ------------------------------------------------------------------------
# IQ3_XXS_B16 (kernels/iq3_b16.py's layout) dequantized to fp16 or fp32 rows: prefill's GEMMs over the GPU
# backend's B16 matrices (lite/backends/cuda_linear.py _dequant_f16). Not in the registry: a record interleaves
# 16 rows, so unlike the registry's launchers this one needs the matrix's shape. Its bandwidth against the
# copy ceiling: BENCHMARKS.md. The CUDA C: kernels/cuda/dequant_iq3_b16.cuh.
#
# A warp a record (a band of 16 rows, a block of 256 columns), 4 records a CTA (2 for fp32); lane 4g + q
# decodes its 32 grid words (rows g and g + 8, words q and q + 4 of each chunk) as 4 values each into
# shared memory, from which the warp writes whole rows. The arithmetic is
# gguf-py's, in its order: (d (0.5 + sc)) 0.5, times the grid value, the sign last, so that fp32
# output equals gguf.quants.dequantize exactly.


def c_source():
    """The kernel after the unsigned grid it reads (the module adds the half helpers: _module)."""
    return source("iq3_grid.cuh", "dequant_iq3_b16.cuh")


WARPS = {np.dtype(np.float16): 4, np.dtype(np.float32): 2}      # Bands16DequantShape<O>::W


def launch_shape(rows, cols, out_dtype):
    """(grid, block) of dequantize_bands16 for a rows x cols matrix of out_dtype: a warp a record."""
    w = WARPS[np.dtype(out_dtype)]
    return (-(-(cols // 256) // w), rows // 16), (32 * w,)


@functools.lru_cache(maxsize=None)
def _module(device):
    import cupy
    return cupy.RawModule(code=includes("iq_helpers.cuh", "iq3_grid.cuh", "dequant_iq3_b16.cuh"), options=("--std=c++17",),
                          name_expressions=["dequantize_bands16<float>", "dequantize_bands16<unsigned short>"])


def dequantize(records, rows, cols, out_dtype=np.float16, stream=None, out=None):
    """IQ3_XXS_B16 records (repack's) as a (rows, cols) matrix of out_dtype (float16 or
    float32) on `stream`, into `out` if given; no host synchronization."""
    import cupy
    check_shape(rows, cols)
    if records.size != nbytes(rows, cols):
        raise ValueError(f"{NAME}: {records.size} bytes for {rows}x{cols} (want {nbytes(rows, cols)})")
    dt = np.dtype(out_dtype)
    if dt not in (np.dtype(np.float16), np.dtype(np.float32)):
        raise ValueError(f"{NAME}: out_dtype float16 or float32, not {dt}")
    out = cupy.empty((rows, cols), dt) if out is None else out.reshape(rows, cols)
    kernel = "dequantize_bands16<float>" if dt == np.float32 else "dequantize_bands16<unsigned short>"
    f = _module(cupy.cuda.runtime.getDevice()).get_function(kernel)
    with stream if stream is not None else contextlib.nullcontext():
        f(*launch_shape(rows, cols, dt), (records, out, np.int32(rows), np.int32(cols)))
    return out
