// IQ3_XXS's decode products on dp4a over quantized x (kernels/matvec_q8.py, matvec_q8_iq3.py): the x
// quantizer and matvec_with_init over TIQ3_XXS_INT8 (the file's layout) or TIQ3_XXS_G4_INT8 (IQ3_XXS_G4); also the base of
// the tensor-core product's module (mma_iq3_b16.cu) and the epilogue kernels' IQ3_XXS module.
#include "iq_helpers.cuh"
#include "iq3_grid.cuh"
#include "iq3_offset_tables.cuh"
#include "iq4_values.cuh"
#include "matvec_common.cuh"
#include "matvec_register_loop.cuh"
#include "matvec_iq_common.cuh"
#include "matvec_iq3_xxs.cuh"
#include "matvec_iq4_xs.cuh"
#include "iq3_xxs_struct.cuh"
#include "matvec_with_init.cuh"
#include "int8_x_records.cuh"
#include "int8_iq3_xxs_structs.cuh"
