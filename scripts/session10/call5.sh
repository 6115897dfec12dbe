#!/usr/bin/env bash
# Session 10, call 5 (warm or carry .whl): the signed layout on kernels that keep more loads in
# flight. Call 4 (Nsight Compute at 1.94 GHz): mv_iq2 over it stalls ~48% of a warp's cycles on
# global loads (long scoreboard), issue 44%, DRAM 32%: latency-bound with one trip of loads in flight.
# Here matvec_staged's mvs (cp.async stages in shared memory) and mvp (persistent, the next item's
# loads in registers) over TIQ3_XXSS.
# (As run: the variants and symbols it names that lost were deleted afterwards; see BENCHMARKS, session 10.)
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
timeout 500 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS \
    --variants mvq40s12,mvq41s12,mvqs43,mvqs44,mvqs83,mvqs24,mvqs46,mvqs82,mvqp4s12,mvqp8s12 \
    --shapes 4096x14336,14336x4096,4096x4096 2>&1 | tee $O/sweep.log | grep -E "^IQ3|MISMATCH|mismatches|regs|copy|Error"
