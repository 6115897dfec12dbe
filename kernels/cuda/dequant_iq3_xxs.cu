// IQ3_XXS dequantized on the GPU (kernels/dequant_iq3_cuda.py): the file's layout and IQ3_XXS_G4.
#include "iq_helpers.cuh"
#include "iq3_grid.cuh"
#include "dequant_iq3_xxs.cuh"
