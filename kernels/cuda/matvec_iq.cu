// IQ3_XXS's and IQ4_XS's decode products over float x (kernels/matvec_iq.py): the register kernels
// mv_iq3xxs / mv_iq4xs, and IQ3_XXS's struct on the persistent loop (matvec_persistent).
#include "iq_helpers.cuh"
#include "iq3_grid.cuh"
#include "iq4_values.cuh"
#include "matvec_common.cuh"
#include "matvec_persistent.cuh"
#include "matvec_iq_common.cuh"
#include "matvec_iq3_xxs.cuh"
#include "matvec_iq4_xs.cuh"
#include "iq3_xxs_struct.cuh"
