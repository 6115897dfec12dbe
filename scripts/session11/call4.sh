# Session 11, call 4: mvt with x's records in shared memory (X=1: copied from qx's output; X=2: made by
# the CTA, no qx launch), the compute alone (d1) and whole, at 4096x14336 and 4096x4096.
source scripts/device_setup.sh
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS"
V=mvq40g12,mvqw8x4g1,mvqw8x4g1x1,mvqw8x4g1x2,mvqw8x4g1d1,mvqw8x4g1d1x1,mvqw8x4g1d1x2,mvqw4x8g1x1,mvqw4x8g1x2,mvqw4x8g1d1x1,mvqw4x8g1d1x2
timeout 200 $S --variants $V --shapes 4096x14336,4096x4096 2>&1 | grep -v "^  IQ3" | tr '|' '\n'
