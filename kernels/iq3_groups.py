"""IQ3_XXS_G4: IQ3_XXS blocks regrouped for the GPU's decode products.

An IQ3_XXS block is 98 bytes: d (2), 64 grid-index bytes, then a word a chunk of 32 weights: four
7-bit sign fields (the eighth sign of each 8 completes an even parity) and a 4-bit scale. At 98
bytes blocks are only 2-aligned, so the decode product (kernels/matvec_q8.py) read a lane's
chunk as seven 16-bit loads (L1/TEX-bound in Nsight Compute), then spent ~6
instructions a 4-weight word turning the 7-bit fields into byte masks. Regrouped, every 4 blocks
of a row are 408 bytes (block k's parts k-th in each field):

    [64 x 4 grid-index bytes][32 sign words][4 scale words][4 x 2 d]

- grid indices as the file has them (chunk j of the group at 8 j);
- chunk j's sign word at 256 + 4 j holds all 32 signs, the parity ones too, weight 4 w + i of the
  chunk at bit 8 i + w, so that a word's 4 signs reach the byte tops with one shift and PRMT's
  sign-replicate mode makes its byte mask (2 instructions a word);
- block k's 8 chunk scales as nibbles of one word (chunk 8 k + c at bits 4 c), then the 4 d.

A lane's chunk is then one 8-byte and one 4-byte load, each coalesced across the warp, and two
broadcast loads. 4% more bytes than the file (408 against 392: the parity bits and the scales'
own words); the bandwidth figures count the file's bytes. Faster than the file's layout (fewer
SASS instructions in the loop: BENCHMARKS.md). Rows stay whole byte ranges (row r
is bytes r*rb .. (r+1)*rb), so row slices and stacked rows (q/k/v) keep working; a row must be
whole groups: cols a multiple of 1024.

Who reads it: the GPU backend regroups its 2-D IQ3_XXS weights after loading (kernels/gpu_layout.py,
BackendConfig.iq3_layout "groups4") and names them IQ3_XXS_G4 (registry.GPU_LAYOUTS, 102 bytes a block); the decode
products take matvec_with_init<Iq3XxsGroup4Int8X> (matvec_q8) or, with an epilogue, matvec_fused_end<Iq3XxsGroup4Int8X> (matvec_epilogue),
the prefill's and the embedding rows' dequantize kernels/dequant_iq.py's g4 CUDA C kernels (Numba:
dequant_iq's _p_iq3_xxs_g4). MoE experts stay in the file's layout (768-column experts are not
whole groups; the expert streaming copies file bytes).
"""
import numpy as np

from lite.kernels.matvec_cuda import INT8_DOT_TYPES
from lite.kernels.registry import register_matvec
from lite.kernels.util import SIMULATOR

NAME = "IQ3_XXS_G4"
GROUP_COLS = 1024
GROUP_BYTES = 408      # 4 blocks (the file's 392)


def regroupable(qtype, shape):
    """True for a 2-D IQ3_XXS matrix whose rows are whole groups of four blocks."""
    return qtype == "IQ3_XXS" and len(shape) == 2 and shape[-1] % GROUP_COLS == 0


def nbytes(rows, cols):
    """Bytes of a rows x cols matrix in this layout."""
    return rows * (cols // GROUP_COLS) * GROUP_BYTES


def _sign_bit(l, b):
    """Where weight 8 l + b of a chunk (sign field l, bit b) sits in its sign word."""
    return 8 * (b % 4) + 2 * l + b // 4


def _sign_words():
    """(4, 128) uint32: the sign word bits of sign field l for its 7 stored bits e (with parity)."""
    from lite.kernels.iq_tables import ksigns
    ks = ksigns().astype(np.uint32)
    out = np.zeros((4, 128), np.uint32)
    for l in range(4):
        for b in range(8):
            out[l] |= ((ks >> np.uint32(b)) & np.uint32(1)) << np.uint32(_sign_bit(l, b))
    return out


def _xp(a):
    return np if isinstance(a, np.ndarray) else __import__("cupy")


def repack(blocks, rows, cols):
    """IQ3_XXS blocks (uint8, rows x cols/256 blocks of 98 bytes) regrouped (a new flat uint8 array
    of nbytes(rows, cols); NumPy or CuPy, as given)."""
    if cols % GROUP_COLS:
        raise ValueError(f"IQ3_XXS regroup: cols={cols} is not a multiple of {GROUP_COLS} (groups of 4 blocks)")
    xp, ng = _xp(blocks), cols // GROUP_COLS
    b = blocks.reshape(rows, ng, 4, 98)
    aux = xp.ascontiguousarray(b[..., 66:98]).view(xp.uint32).reshape(rows, ng, 4, 8)
    table = xp.asarray(_sign_words())
    signs = xp.zeros(aux.shape, xp.uint32)
    for l in range(4):
        signs |= table[l][(aux >> np.uint32(7 * l)) & np.uint32(127)]
    scales = xp.zeros((rows, ng, 4), xp.uint32)
    for c in range(8):
        scales |= (aux[..., c] >> np.uint32(28)) << np.uint32(4 * c)
    parts = (b[..., 2:66].reshape(rows, ng, 256), signs.view(xp.uint8).reshape(rows, ng, 128),
             scales.view(xp.uint8).reshape(rows, ng, 16), b[..., 0:2].reshape(rows, ng, 8))
    return xp.ascontiguousarray(xp.concatenate(parts, axis=2)).reshape(-1)


def unpack(grouped, rows, cols):
    """The inverse of repack: the file's layout again (tests, and anyone who must hand the bytes on)."""
    xp, ng = _xp(grouped), cols // GROUP_COLS
    g = grouped.reshape(rows, ng, GROUP_BYTES)
    signs = xp.ascontiguousarray(g[..., 256:384]).view(xp.uint32).reshape(rows, ng, 4, 8)
    scales = xp.ascontiguousarray(g[..., 384:400]).view(xp.uint32).reshape(rows, ng, 4, 1)
    aux = (scales >> (4 * xp.arange(8, dtype=xp.uint32))) << np.uint32(28)
    for l in range(4):
        for b in range(7):
            aux |= ((signs >> np.uint32(_sign_bit(l, b))) & np.uint32(1)) << np.uint32(7 * l + b)
    out = xp.empty((rows, ng, 4, 98), np.uint8)
    out[..., 2:66] = g[..., 0:256].reshape(rows, ng, 4, 64)
    out[..., 66:98] = xp.ascontiguousarray(aux).view(xp.uint8).reshape(rows, ng, 4, 32)
    out[..., 0:2] = g[..., 400:408].reshape(rows, ng, 4, 2)
    return out.reshape(-1)


@register_matvec(NAME)
def launch(blocks, x, out, rows, cols, stream=None, pdl=False, int8_dot_types=INT8_DOT_TYPES, reference=False):
    """The decode product of IQ3_XXS_G4 weights: quantize_x + matvec_with_init<Iq3XxsGroup4Int8X> (kernels/matvec_q8.py), the
    only kernel that reads this layout (the backend regroups only where it runs: applies() below)."""
    from lite.kernels import matvec_iq, matvec_q8
    if not applies(int8_dot_types, reference):
        raise ValueError("IQ3_XXS_G4 weights need the integer-dot decode kernels (int8_dot_types naming "
                         "IQ3_XXS, the CUDA C kernels on a GPU)")
    matvec_iq.check_args(NAME, x, out, rows, cols, GROUP_COLS)
    if not matvec_q8.qualifies(NAME, blocks, x):
        raise ValueError(f"IQ3_XXS_G4 matvec: blocks must be {matvec_q8.ALIGN[NAME]}-byte and x 16-byte aligned")
    matvec_iq.launch_cuda(NAME, blocks, x, out, rows, cols, stream, pdl, int8_dot_types)


def applies(int8_dot_types=INT8_DOT_TYPES, reference=False):
    """Can the decode products read IQ3_XXS_G4 here (the GPU's CUDA C kernels, IQ3_XXS on dp4a)?"""
    return not (SIMULATOR or reference) and "IQ3_XXS" in int8_dot_types
