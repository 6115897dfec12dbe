# Session 11, call 18: the sweep after the review's mend (labels that do not fit are skipped, the D > 0
# diagnostics timed but not checked).
source scripts/device_setup.sh >/dev/null 2>&1; timeout 100 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvq42g12,mvqv8x4x1,mvqw8x4g1d1 --shapes 4096x14336 2>&1 | grep -v "^  IQ3" | tr '|' '\n' | tail -12
