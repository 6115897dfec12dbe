"""The per-type decode structs of the register matvec kernels (kernels/matvec_cuda.py: matvec_rows; also
matvec_epilogue's matvec_fused_end, moe_products' moe_sorted_product / moe_decode_product), in CUDA C after
matvec_cuda.C_HEAD (its BF, LO4, dot16, dot8, kblock_scales): TQ4_0, TQ8_0, TQ4_K, TQ5_K, TQ6_K, and
TQ4_KH, Q4_K with the dot in two instructions a weight (below).

TQ4_KH ("the two-instruction dot") is Q4_K's struct wherever x is not quantized (faster end to end than TQ4_K).

Why: the register kernel is issue and latency bound (~5 instructions a weight): the exponent trick of matvec_cuda (BF) places
a quant byte under 0x4B000000 (2^23 + b) and needs an FADD a weight to remove the 2^23 before the
FFMA. Here the byte goes under the exponent of 0.5 as mantissa bits 16-22, which reads as the exact
float 0.5 + b/256 for b < 128; the FFMA takes it as it is, and a 16-weight run's sum is corrected
once: sum x*b = 256 * sum x*(0.5 + b/256) - 128 * sum x (both scalings exact; the sum of x is
load_x's, which the K-quants' minimums already use). The 0.5 * x parts cancel in the correction:
a run's error relative to sum |x|*b is ~5e-7 typical, 6e-6 at worst (NumPy fp32 model of the
arithmetic, 20,000 random runs, half of them all-positive x; the three-instruction dot: 3e-7),
far inside the 1e-3 the kernels are held to. nvcc sm_90: matvec_rows<TQ4_KH, 1, 8, 0>
80 registers against matvec_rows<TQ4_K, 1, 8, 0>'s 95, PTX adds 419 -> 177.
"""

# Types with a two-instruction struct T<type>H beside T<type> (matvec_cuda.plan's fast dot).
FAST_DOT = ("Q4_K",)

# Each type: BE values and TS bytes a block, CPB chunks (of 32 weights) a block; Raw, what load()
# reads for one row and chunk; xoff(c, k), the column of float4 k (0..7) of x for chunk c; dot(),
# the chunk's contribution given those 8 float4 and the sums of the first and last 4 of them
# (kernels/cuda/matvec_float_structs.cuh).
from lite.kernels.cuda_source import source  # noqa: E402

C_TYPES = source("matvec_float_structs.cuh")


# The launch shape every register decode product shares (matvec_cuda, matvec_q8): x rows a launch,
# threads a CTA.
C_MAX_N = 8
THREADS = 128
# The types whose decode products can quantize x and run on dp4a (kernels/matvec_q8.py): the default
# of BackendConfig.int8_dot_types and of every `int8_dot_types` argument of the kernels.
INT8_DOT_TYPES = ("Q4_K", "Q6_K", "IQ3_XXS")
# Byte alignment the register kernel needs of the block buffer (16-byte loads vs 32-bit word loads).
ALIGN = {"Q4_0": 4, "Q8_0": 4, "Q4_K": 16, "Q5_K": 16, "Q6_K": 4}


def _ptr(a):
    return a.data.ptr
