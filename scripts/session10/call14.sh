#!/usr/bin/env bash
# Session 10, call 14 (carry .whl): mv_iq2 over IQ3_XXS_G4 held to MINB CTAs an SM (matvec_iq_v2's
# mv_iq2b), so that prefetching the next trip fits the 56 registers of no prefetch (call 2: prefetch
# at 64 registers, 12.6 us alone at 4096x14336 against 13.7, lost its overlap with the quantizer).
# (As run: the variants and symbols it names that lost were deleted afterwards; see BENCHMARKS, session 10.)
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
timeout 200 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS \
    --variants mvq40g12,mvq41g12,mvqb419,mvqb409,mvqb418,mvqb2112,mvqb815 \
    --shapes 4096x14336,14336x4096,4096x4096 2>&1 | tee $O/sweep.log | grep -E "^IQ3|MISMATCH|mismatches|regs|Error"
