# Session 12, call 6: mvit (mvi's int8 mma compute over the CTA's bands copied whole into shared memory
# by bulk copies before the PDL wait) against mvi; the default mv_iq2 (mvq42g12) in the same call.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session12/mvc_proto.py 2>&1 | grep -A40 "^shape"
timeout 100 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvq42g12 --shapes 4096x14336,14336x4096,4096x4096 2>&1 | tr '|' '\n' | grep "mvq\|mism"
