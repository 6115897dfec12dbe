#!/usr/bin/env bash
# Session 9, call 1 (carry .whl): session 8's `next` step (host-expert GPU tests with the session-8
# defaults, ncu on IQ3_XXS and Q4_K, the grouped IQ3_XXS layout and 32 grid copies in both layouts).
set -u
source scripts/device_setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
bash scripts/gpu_first_checks.sh next
