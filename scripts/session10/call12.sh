#!/usr/bin/env bash
# Session 10, call 12 (warm or carry .whl): the other GPU test files that load IQ3_XXS models (their
# dense weights regrouped into the new IQ3_XXS_G4), after calls 9-10 ran the kernel and backend ones.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_experts_iq.py tests/test_experts.py tests/test_expert_residency.py \
    tests/test_matvec_epilogue.py tests/test_decode_io.py -k "IQ3 or iq3 or epilogue or decode_io" > $O/tests.log 2>&1
echo "tests rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -6
