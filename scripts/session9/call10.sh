#!/usr/bin/env bash
# (session 9: the launch bounds were put back after this call: with (128, P ? 8 : 1) the P = 0 kernels took 79-101 registers, against 56-62 with (128) alone; P = 1 at 64 was mixed)
# Session 9, call 10 (carry .whl): mv_iq2 with prefetch (P = 1) held to 64 registers
# (__launch_bounds__(128, 8): 8 CTAs an SM, so 1,024 CTAs stay one wave; at 66 registers call 3's
# mvq41g12 needed a second partial wave), beside the default P = 0, both layouts.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
for lay in 0 1; do
  echo "LITE_Q8_LAYOUT=$lay"
  LITE_Q8_LAYOUT=$lay timeout 150 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS \
      --variants mvq40g12,mvq41g12,mvq40t12,mvq41t12 --shapes 4096x14336,14336x4096,4096x4096 2>&1 \
      | grep -E "^IQ3|MISMATCH|mismatches|regs"
done
