# Session 11, call 7: call 6 found the grid copies' fill (~1 us a 16 KB, a load-store loop) on mvt's
# path, which also slowed repack12's TIQ3_XXSW (its 16 KB table): that fill now loads first.
source scripts/device_setup.sh >/dev/null 2>&1
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS"
timeout 200 $S --variants mvq40g12,mvqw8x4g1,mvqw8x4g1d1,mvqv8x4,mvqv8x4d1,mvqv4x8,mvqv4x8d1 --shapes 4096x14336 2>&1 | grep -v "^  IQ3\|MISMATCH" | tr '|' '\n'
timeout 200 $S --variants mvq40g12,mvqw8x4g1x1,mvqw8x4g1d1x1,mvqv8x4x1,mvqv8x4d1x1,mvqv8x4x2 --shapes 4096x4096 2>&1 | grep -v "^  IQ3\|MISMATCH" | tr '|' '\n'
