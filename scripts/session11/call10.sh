# Session 11, call 10: mvt with a barrier a trip and team (a team starts when its own rows' trip has
# landed) and the last half trip spread over all threads (Nsight, call 8: the closing barrier ~16% of
# issue); then qxe (the quantizer lets the product launch before it waits) in front of each.
source scripts/device_setup.sh >/dev/null 2>&1
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --shapes 4096x14336"
timeout 150 $S --variants read,mvq40g12,mvqw8x4g1,mvqw8x4g1d1,mvqv8x4,mvqv8x4d1,mvqv4x8 2>&1 | grep -v "^  IQ3\|MISMATCH" | tr '|' '\n'
LITE_SWEEP_QXE=1 timeout 150 $S --variants mvq40g12,mvqw8x4g1,mvqv8x4 2>&1 | grep -v "^  IQ3\|MISMATCH" | tr '|' '\n'
