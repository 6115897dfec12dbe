# Session 12, call 5: mvi (int8 mma) with its table copied from a precomputed global one, P blocks
# loaded ahead, under PDL; the default mv_iq2 (mvq42g12) in the same call.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session12/mvc_proto.py 2>&1 | tail -23
timeout 100 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvq42g12 --shapes 4096x14336,14336x4096,4096x4096 2>&1 | tr '|' '\n' | grep "mvq\|mism"
