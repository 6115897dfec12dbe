// IQ3_XXS_B16 dequantized to rows (kernels/dequant_b16.py).
#include "iq_helpers.cuh"
#include "iq3_grid.cuh"
#include "dequant_iq3_b16.cuh"
