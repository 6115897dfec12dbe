"""The CUDA C of kernels/matvec_mma.py's bands16_product (IQ3_XXS_B16's decode product on the tensor cores), apart from its
launcher as cupy_decode_src / moe_cuda_src are: the int8 mma and its host emulation, the tables, a block's
products (lt_b16_block; lt_b16_decode and lt_b16_mul, its two halves, for the block decoded before the PDL wait),
then (C_BODY, after kernels/matvec_mma_end.py's lt_mvb_end: the decode step's next op folded in) the kernel (mvb_body,
with the diagnostics LT_MVB_DIAG_* and the timeline LT_MVB_STAMPS). What each part does and what it was measured
at: the comments beside it and kernels/matvec_mma.py's docstring."""
import numpy as np

from lite.kernels import iq_tables
from lite.kernels.cuda_source import source

C_MMA = source("mma_iq3_b16.cuh")

# mvb_body, the kernels (after kernels/matvec_mma_end.py's C_END: lt_mvb_end, the decode step's next op folded in)
C_BODY = source("mma_iq3_b16_body.cuh")

C_HALVES = source("half_words.cuh")


def table_words():
    """The 4096 signed grid words of LT_TAB4096: entry idx | signs << 8, byte i = -g or g (sign bit i)."""
    g = iq_tables.grid_values("IQ3_XXS").astype(np.int64)
    e = np.arange(4096)
    v = np.where((e[:, None] >> (8 + np.arange(4))) & 1, -g[e & 255], g[e & 255]) & 255
    return (v[:, 0] | v[:, 1] << 8 | v[:, 2] << 16 | v[:, 3] << 24).astype(np.uint32)


def c_source():
    """kernels/cuda/mma_iq3_b16.cu (after matvec_q8's IQ3_XXS text, which holds quantize_x, lt_q8w, lt_topmask and the
    unsigned grid IQ3XXS_GRID)."""
    return source("mma_iq3_b16.cu")
