# Session 11, call 6: is mvt's compute bound by shared-memory wavefronts (the grid lookups' ~3-way bank
# conflicts)? Grid copies 1 / 16 / 32 (conflict-free) with x's records in shared memory (X=1, so that
# the bigger table does not squeeze x out of L1), whole and compute alone, at the 4096-column shapes.
source scripts/device_setup.sh >/dev/null 2>&1
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS"
V=mvq40g12,mvqw8x4g1x1,mvqw8x4g16x1,mvqw8x4g32x1,mvqw8x4g1d1x1,mvqw8x4g16d1x1,mvqw8x4g32d1x1
timeout 200 $S --variants $V --shapes 14336x4096,4096x4096 2>&1 | grep -v "^  IQ3\|MISMATCH" | tr '|' '\n'
