# Session 12, call 2: is repack12's mvt (TIQ3_XXSW) held back by x's records missing L1? Its compute alone
# (D = 1) against TIQ3_XXSG's where shared memory is small (4096 columns), with x in shared memory (X = 1),
# at 24 rows a CTA, and with the carveout at the least shared memory that fits (more L1).
source scripts/device_setup.sh >/dev/null 2>&1
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS"
f() { timeout 120 "$@" 2>&1 | grep -v "^  IQ3" | tr '|' '\n' | grep -v "register\|^copy\|mvq42g12 " ; }
f $S --variants mvq42g12,mvqw8x4g1d1,mvqv8x4d1,mvqw8x4g1d1x1,mvqv8x4d1x1 --shapes 4096x4096,14336x4096
f $S --variants mvqw8x4g1d1,mvqv8x4d1,mvqw6x4g1d1,mvqv6x4d1,mvqw8x4g1,mvqv8x4 --shapes 4096x14336
LITE_SWEEP_CARVEOUT=min f $S --variants mvqw8x4g1d1,mvqv8x4d1,mvqw6x4g1d1,mvqv6x4d1,mvqw8x4g1,mvqv8x4 --shapes 4096x14336
