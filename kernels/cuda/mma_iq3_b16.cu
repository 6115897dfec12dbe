// IQ3_XXS_B16's decode product on the tensor cores (kernels/matvec_mma.py's bands16_product / bands16_product_fused_end), after
// matvec_iq3_int8.cu (its x quantizer quantize_x_early, lt_q8w, lt_topmask and the grid IQ3XXS_GRID).
#include "half_words.cuh"
#include "mma_iq3_b16.cuh"
#include "mma_iq3_b16_end.cuh"
#include "mma_iq3_b16_body.cuh"
