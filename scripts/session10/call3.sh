#!/usr/bin/env bash
# Session 10, call 3 (warm or carry .whl): mv_iq3t, teams of 128 threads sharing one CTA's 32 grid
# copies (conflict-free lookups), over both grouped layouts, against mv_iq2 (call 2: the signed
# layout's 22% fewer instructions left the product alone even, 13.7 against 13.6 us: not issue-bound).
# (As run: the variants and symbols it names that lost were deleted afterwards; see BENCHMARKS, session 10.)
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
timeout 500 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS \
    --variants mvq40g12,mvq40s12,mvqt440s32,mvqt440g32,mvqt441s32,mvqt420s32,mvqt240s32,mvqt840s32,mvqt440s16,mvqt480s32,mvqt440s1,mvqt440s32p,mvq40s12p \
    --shapes 4096x14336,14336x4096,4096x4096 2>&1 | tee $O/sweep.log | grep -E "^IQ3|MISMATCH|mismatches|regs|copy"
