# Session 12, call 20: kernels/matvec_mma.py as committed (mvx's form, config(rows, SMs): (8, 2) where the
# bands fill one round, else (8, 1)): its GPU test, then the kernel table twice.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
for i in 1 2; do timeout 200 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 2>&1 | grep "copy-vec16\|matvec"; done
