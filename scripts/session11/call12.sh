# Session 11, call 12: mv_iq2h (the last half trip of a 14336-column row spread over all 128 threads,
# half the rows each) against mv_iq2 at 4096x14336, with the quantizer and alone, three times.
source scripts/device_setup.sh >/dev/null 2>&1
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --shapes 4096x14336"
for i in 1 2 3; do timeout 100 $S --variants mvq40g12,mvq4hg12,mvq2hg12,mvq8hg12,mvq20g12,mvq80g12 2>&1 | grep -v "^  IQ3\|MISMATCH" | tr '|' '\n'; done
