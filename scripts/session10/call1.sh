#!/usr/bin/env bash
# Session 10, call 1 (carry .whl): every test file with GPU tests, at HEAD of session 9 (after the IQ3_XXS epilogue change and the review mend; session 9 call 6 ran them before both).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
timeout 560 python3 -m pytest -q -p no:cacheprovider --durations=8 tests/test_kernels_iq.py tests/test_kernels_dequant.py \
    tests/test_kernels_matvec.py tests/test_cuda_backend.py tests/test_cuda_decode.py tests/test_decode_io.py \
    tests/test_flash_attn.py tests/test_experts.py tests/test_experts_iq.py tests/test_experts_mvw.py \
    tests/test_expert_devcache.py tests/test_expert_residency.py tests/test_cli.py tests/test_multi_gpu.py > $O/tests.log 2>&1
echo "rc $?"
grep -E "^FAILED|^ERROR|passed|failed|slowest|^[0-9.]+s " $O/tests.log | tail -30
