#!/usr/bin/env bash
# Session 10, call 6 (warm or carry .whl): mv_iq2 with balanced trips (matvec_cuda mv_body B = 1:
# 448 chunks as 4 trips of 112, not 3.5 of 128). Call 4: SM active 23.6K of 30.1K elapsed cycles,
# the CTAs' warps 2-3 done a trip before warps 0-1; calls 2-5: fewer instructions, conflict-free
# lookups, staged / persistent loads all even or worse.
# (As run: the variants and symbols it names that lost were deleted afterwards; see BENCHMARKS, session 10.)
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
timeout 500 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS \
    --variants mvq40s12,mvq40g12,mvqb40s,mvqb40g,mvqb41s,mvqb20s,mvqb80s,mvq41s12 \
    --shapes 4096x14336,14336x4096 2>&1 | tee $O/sweep.log | grep -E "^IQ3|MISMATCH|mismatches|regs|copy|Error"
