# Session 11, call 11: mvt's bulk copies and waits alone (D=2, no compute) against a plain read, the
# compute alone (D=1) and the whole: what keeps the whole 4.7 us above the compute (call 10)?
source scripts/device_setup.sh >/dev/null 2>&1
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --shapes 4096x14336"
timeout 150 $S --variants read,mvqw8x4g1,mvqw8x4g1d1,mvqw8x4g1d2 2>&1 | grep -v "^  IQ3\|MISMATCH" | tr '|' '\n'
