// The K types' decode products on dp4a over quantized x (kernels/matvec_q8.py): the x quantizer quantize_x and
// matvec_rows over TQ4_KQ / TQ6_KQ, on the register loop of matvec.cu.
#include "matvec_common.cuh"
#include "matvec_float_structs.cuh"
#include "matvec_register_loop.cuh"
#include "int8_x_records.cuh"
#include "int8_kquant_structs.cuh"
