"""IQ3_XXS_G4: IQ3_XXS blocks regrouped for the GPU's decode products (session 9).

An IQ3_XXS block is 98 bytes: d (2), 64 grid-index bytes, 32 sign/scale bytes. At 98 bytes blocks
are only 2-aligned, so the decode product (kernels/matvec_q8_iq3.py) read a lane's chunk of 32
weights as seven 16-bit loads, each using 10 of the 32 bytes of the sectors a warp touches (Nsight
Compute, session 8: L1/TEX 76% busy). Regrouped, every 4 blocks of a row are 392 bytes:

    [64 x 4 grid-index bytes][32 x 4 sign/scale bytes][4 x 2 d]    (block k's parts k-th in each)

the same bytes and the same size, so a lane's chunk is one 8-byte and one 4-byte load, each
coalesced across the warp (TIQ3_XXSG in matvec_q8_iq3.py). H200, session 9 (call 3, 4096x14336,
the product alone): 16.9 -> 13.7 us. Rows stay whole byte ranges (row r is bytes r*rb .. (r+1)*rb
in both layouts), so row slices and stacked rows (q/k/v) keep working; a row must be whole groups:
cols a multiple of 1024.

Who reads it: the GPU backend regroups its 2-D IQ3_XXS weights after loading (lite/backends/cuda.py,
LITE_IQ3_REGROUP) and names them IQ3_XXS_G4 (registry.GPU_LAYOUTS); the decode products take
mv_iq2<TIQ3_XXSG> (matvec_q8) or, with an epilogue, mve<TIQ3_XXSG> (matvec_epilogue), the
prefill's and the embedding rows' dequantize
kernels/dequant_iq3_cuda.py's g4 kernels (Numba: dequant_iq's _p_iq3_xxs_g4). MoE experts stay in
the file's layout (768-column experts are not whole groups; the expert streaming copies file bytes).
"""
import numpy as np

from lite.kernels.registry import register_matvec

NAME = "IQ3_XXS_G4"
GROUP_COLS = 1024


def regroupable(qtype, shape):
    """True for a 2-D IQ3_XXS matrix whose rows are whole groups of four blocks."""
    return qtype == "IQ3_XXS" and len(shape) == 2 and shape[-1] % GROUP_COLS == 0


def repack(blocks, rows, cols):
    """IQ3_XXS blocks (uint8, rows x cols/256 blocks of 98 bytes) regrouped (a new flat array of
    the same size; NumPy or CuPy, as given)."""
    if cols % GROUP_COLS:
        raise ValueError(f"IQ3_XXS regroup: cols={cols} is not a multiple of {GROUP_COLS} (groups of 4 blocks)")
    nb = cols // 256
    b = blocks.reshape(rows, nb // 4, 4, 98)
    xp = np if isinstance(blocks, np.ndarray) else __import__("cupy")
    parts = (b[..., 2:66].reshape(rows, nb // 4, 256), b[..., 66:98].reshape(rows, nb // 4, 128),
             b[..., 0:2].reshape(rows, nb // 4, 8))
    return xp.ascontiguousarray(xp.concatenate(parts, axis=2)).reshape(-1)


def unpack(grouped, rows, cols):
    """The inverse of repack: the file's layout again (tests, and anyone who must hand the bytes on)."""
    nb = cols // 256
    g = grouped.reshape(rows, nb // 4, 392)
    xp = np if isinstance(grouped, np.ndarray) else __import__("cupy")
    out = xp.empty((rows, nb // 4, 4, 98), np.uint8)
    out[..., 2:66] = g[..., 0:256].reshape(rows, nb // 4, 4, 64)
    out[..., 66:98] = g[..., 256:384].reshape(rows, nb // 4, 4, 32)
    out[..., 0:2] = g[..., 384:392].reshape(rows, nb // 4, 4, 2)
    return out.reshape(-1)


@register_matvec(NAME)
def launch(blocks, x, out, rows, cols, stream):
    """The decode product of IQ3_XXS_G4 weights: qx + mv_iq2<TIQ3_XXSG> (kernels/matvec_q8.py), the
    only kernel that reads this layout (the backend regroups only where it runs: applies() below)."""
    from lite.kernels import matvec_iq, matvec_q8
    if not applies():
        raise ValueError("IQ3_XXS_G4 weights need the integer-dot decode kernels (LITE_MATVEC_Q8 naming "
                         "IQ3_XXS, the CUDA implementation on a GPU)")
    matvec_iq.check_args(NAME, x, out, rows, cols, GROUP_COLS)
    if not matvec_q8.qualifies(NAME, blocks, x):
        raise ValueError(f"IQ3_XXS_G4 matvec: blocks must be {matvec_q8.ALIGN[NAME]}-byte and x 16-byte aligned")
    matvec_iq.launch_cuda(NAME, blocks, x, out, rows, cols, stream)


def applies():
    """Can the decode products read IQ3_XXS_G4 here (the GPU, mvq for IQ3_XXS)?"""
    from lite.kernels import matvec_iq, matvec_q8
    return matvec_iq.impl() == "cuda" and matvec_q8.applies("IQ3_XXS")
