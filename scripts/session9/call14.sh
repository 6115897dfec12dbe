#!/usr/bin/env bash
# Session 9, call 14 (carry .whl; the last of the device time): the GPU tests with IQ3_XXS files that
# call 12 did not select, now that IQ3_XXS takes the epilogue kernels (the MoE models' attention too).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
timeout 150 python3 -m pytest -q -x tests/test_experts_iq.py tests/test_cuda_backend.py tests/test_experts.py \
    tests/test_expert_residency.py -k "IQ3 or iq3" 2>&1 | grep -E "^FAILED|^ERROR|passed|failed" | tail -6
