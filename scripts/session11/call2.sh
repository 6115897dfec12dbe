# Session 11, call 2: mvt (teams over rows in dynamic shared memory, 16/32 grid copies) against mv_iq2
# and mvm; D=1 labels time the compute alone (their results are garbage: MISMATCH expected there).
source scripts/device_setup.sh
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS"
V=read,mvq40g12,mvqm8x5712,mvqw8x4g16,mvqw8x4g1,mvqw8x4g32,mvqw8x4g16d1,mvqw8x4g1d1,mvqw4x4g16,mvqw8x2g16,mvqw4x8g16,mvqw16x2g16
timeout 200 $S --variants $V --shapes 4096x14336 2>&1 | grep -v "^  IQ3" | tr '|' '\n'
LITE_SWEEP_QX_CARVEOUT=1 timeout 120 $S --variants mvq40g12,mvqm8x5712,mvqw8x4g16 --shapes 4096x14336 2>&1 | grep -v "^  IQ3" | tr '|' '\n'
timeout 150 $S --variants read,mvq40g12,mvqw8x4g16,mvqw16x2g16,mvqw4x8g16,mvqw8x4g16d1 --shapes 14336x4096,4096x4096 2>&1 | grep -v "^  IQ3" | tr '|' '\n'
