#!/usr/bin/env bash
# Session 9, call 2 (warm or carry .whl): the grouped IQ3_XXS sweep again. Call 1 timed the g labels
# at ~235 us: the sweep repacked each rotating weight copy on its first call, which fell inside the
# graph capture, so the repack's copies were replayed with the product (fixed: first calls outside;
# call 2 still 235 us: dict.setdefault evaluated the repack on every call; fixed for call 3).
set -u
source scripts/device_setup.sh
for lay in 0 1; do
  echo "LITE_Q8_LAYOUT=$lay"
  LITE_Q8_LAYOUT=$lay timeout 200 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS \
      --variants mvq40t12,mvq40g12,mvq40g02,mvq40g322,mvq40g00,mvq80g12,mvq20g12,mvq41g12,mvqp4g12 \
      --shapes 4096x14336,14336x4096,4096x4096 2>&1 | grep -E "^IQ3|MISMATCH|mismatches"
done
