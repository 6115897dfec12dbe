#!/usr/bin/env bash
# Session 10, call 15 (carry .whl): mv_iq2e, the first trip's weights loaded before the PDL wait
# (matvec_q8_iq3, sweep only; 4 rows held to 64 registers, 2 rows at 40), against mv_iq2.
# (As run: the variants and symbols it names that lost were deleted afterwards; see BENCHMARKS, session 10.)
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
timeout 200 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvq40g12,mvqe4,mvqe2,mvq20g12 \
    --shapes 4096x14336,14336x4096,4096x4096 2>&1 | tee $O/sweep.log | grep -E "^IQ3|MISMATCH|mismatches|regs|Error"
