#!/usr/bin/env bash
# Session 10, call 16 (carry .whl): after the review's mend (TIQ3_XXSG on the SC = 2 base, the
# dequantize's sizes from quant_info, its 2-aligned fallback): the IQ3_XXS_G4 kernel and backend tests.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_iq.py tests/test_matvec_q8_emulated.py \
    "tests/test_cuda_backend.py::test_regrouped_iq3xxs_weights_match_cpu_and_the_file_layout" > $O/tests.log 2>&1
echo "tests rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -6
