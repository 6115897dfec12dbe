// The register decode products over float x (kernels/matvec_cuda.py): matvec_rows over each type's struct.
#include "matvec_common.cuh"
#include "matvec_float_structs.cuh"
#include "matvec_register_loop.cuh"
