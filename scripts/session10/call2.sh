#!/usr/bin/env bash
# Session 10, call 2 (warm or carry .whl): IQ3_XXS_G4S, the signed layout (iq3_groups.repack_signs,
# matvec_q8_iq3.TIQ3_XXSS: the signs stored whole, placed for PRMT's sign-replicate mode; 448 SASS
# instructions in mv_iq2's 4-row loop against TIQ3_XXSG's 571) against the default grouped layout.
# (Its first run, the same call, shared the repacked copies between the g and s labels: fixed.)
# (As run: the variants and symbols it names that lost were deleted afterwards; see BENCHMARKS, session 10.)
set -u
source scripts/device_setup.sh
O=${OUT:-/tmp}
timeout 400 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS \
    --variants mvq40g12,mvq40s12,mvq40s02,mvq80s12,mvq20s12,mvq41s12,mvq40s12p,mvq40g12p,mvq41s12p \
    --shapes 4096x14336,14336x4096,4096x4096 2>&1 | tee $O/sweep.log | grep -E "^IQ3|MISMATCH|mismatches|regs|copy"
