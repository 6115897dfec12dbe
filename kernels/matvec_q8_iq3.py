"""IQ3_XXS on dp4a over quantized x (kernels/matvec_q8.py's the integer-dot product): the integer struct TIQ3_XXS_INT8 and
where it finds its tables. matvec_q8 builds the modules (c_source, structs) and names the kernels;
this file holds the IQ3_XXS text, apart from the K types', and the choice of table placement."""
from lite.kernels.cuda_source import source

# IQ3_XXS, after matvec_iq's TIQ3_XXS and
# iq_tables' offset-binary tables: each grid byte g as 64 + g (IQ3XXS_GRID64), 64 - g where its sign bit is set
# (u - 2 (u & 0x3F mask), iq_tables' sign masks as uint2 pairs: no borrow between bytes), so a word of 4 weights
# meets x in 2 dp4a; the offset 64 comes off once a run of 16 as 64 times the run's sum of quantized
# x. Sums a run: |dp4a sums| <= 16 * 126 * 127 (exact), their 254-weighted total < 2^26 (one fp32
# rounding, ~6e-8 of it, before the offset cancels): inside the x quantization's bound.
C_Q8_IQ3 = source("int8_iq3_xxs_structs.cuh")


# Where TIQ3_XXS_INT8 finds its tables (GC, SC, see C_Q8_IQ3): one grid copy in shared memory, the sign
# masks computed (the fastest placement measured, BENCHMARKS.md).
TABLES = (1, 2)

# matvec_cuda's `matvec_rows` with the struct's table fill first: the kernel of every IQ3_XXS integer-dot product.
C_MV_INIT = source("matvec_with_init.cuh")



def struct_name(tables=None, grouped=False):
    """The struct's C++ name for (GC, SC) tables (default TABLES); grouped: IQ3_XXS_G4's (TIQ3_XXS_G4_INT8)."""
    gc, sc = TABLES if tables is None else tables
    return f"{'TIQ3_XXS_G4_INT8' if grouped else 'TIQ3_XXS_INT8'}<{gc}, {sc}>"


def c_text():
    """C_Q8_IQ3 (with its sign-mask table, iq3_sign_masks.cuh: one load a group)."""
    return C_Q8_IQ3
