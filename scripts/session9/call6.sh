#!/usr/bin/env bash
# Session 9, call 6 (carry .whl): every test file with GPU tests, with session 9's defaults (IQ3_XXS
# regrouped; call 5 found test_kernels_iq's staged-kernel assertion stale since session 8's IQ3_XXS
# mvq default, fixed since).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
timeout 560 python3 -m pytest -q -p no:cacheprovider --durations=8 tests/test_kernels_iq.py tests/test_kernels_dequant.py \
    tests/test_kernels_matvec.py tests/test_cuda_backend.py tests/test_cuda_decode.py tests/test_decode_io.py \
    tests/test_flash_attn.py tests/test_experts.py tests/test_experts_iq.py tests/test_experts_mvw.py \
    tests/test_expert_devcache.py tests/test_expert_residency.py tests/test_cli.py tests/test_multi_gpu.py > $O/tests.log 2>&1
echo "rc $?"
grep -E "^FAILED|^ERROR|passed|failed|slowest|^[0-9.]+s " $O/tests.log | tail -30
