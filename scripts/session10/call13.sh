#!/usr/bin/env bash
# Session 10, call 13 (carry .whl): IQ3_XXS_G4's dequantize reading its sign and scale words as 32-bit
# loads (4-aligned blocks; call 10: 74-77% of copy-vec16 with 16-bit halves, against 88% for session
# 9's layout): the GPU test and the kernel table's rows.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_iq.py -k "regrouped" > $O/tests.log 2>&1
echo "tests rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -4
timeout 60 python3 -m lite.kernels.bench --no-numba IQ3_XXS_G4 IQ3_XXS > $O/kbench.log 2>&1
grep -E "copy-vec16|IQ3" $O/kbench.log
