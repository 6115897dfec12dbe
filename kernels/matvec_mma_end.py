"""The end of kernels/matvec_mma.py's bands16_product (CUDA C, between matvec_mma_src's C_MMA and C_BODY): lt_mvb_end, the
decode step's next op folded into the product (bands16_product_fused_end's epilogues and the next norm's first half), and
lt_mvb_quantize_run, the norm out's x records for the product after it."""

from lite.kernels.cuda_source import source  # noqa: E402

C_END = source("mma_iq3_b16_end.cuh")
