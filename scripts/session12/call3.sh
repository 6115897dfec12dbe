# Session 12, call 3: 16 / 32 grid copies (conflict-free lookups) with the fill's loads first, in mv_iq2
# and in mvt, against the default mvq42g12. (Call 1's Nsight: mv_iq2's 32 grid lookups a chunk-row warp
# meet 3.15-way bank conflicts, 1.48M shared wavefronts, ~5.6 us of the shared-memory pipe.)
source scripts/device_setup.sh >/dev/null 2>&1
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS"
timeout 300 $S --variants mvq42g12,mvq42g322,mvq82g322,mvq40g322,mvq42g162,mvq82g162,mvqw8x4g1,mvqw8x4g32,mvqw8x4g32x1,mvqw8x4g16 \
   --shapes 4096x14336,14336x4096,4096x4096 2>&1 | tr '|' '\n' | grep -v "register\|^copy"
