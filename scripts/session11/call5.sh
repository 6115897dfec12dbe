# Session 11, call 5: mvt over repack12's layout (TIQ3_XXSW: 12-bit fields through a 4096-word table; 535
# against 781 SASS instructions in the 8-row loop) against mv_iq2 and mvt over G4. (First try: X=1 at
# 4096x14336 does not fit: 32 rows + x's records + the 16 KB table > 227 KB.)
source scripts/device_setup.sh
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS"
V=read,mvq40g12,mvqw8x4g1,mvqv8x4,mvqv8x4d1,mvqv4x8,mvqv4x8d1
timeout 200 $S --variants $V --shapes 4096x14336 2>&1 | grep -v "^  IQ3" | tr '|' '\n'
timeout 200 $S --variants read,mvq40g12,mvqv8x4,mvqv8x4x1,mvqv8x4x2,mvqv8x2x1,mvqv4x4x1,mvqv8x2x2 --shapes 14336x4096,4096x4096 2>&1 | grep -v "^  IQ3" | tr '|' '\n'
