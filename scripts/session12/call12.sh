# Session 12, call 12: kernels/matvec_mma.py's mvb (IQ3_XXS_B16) on the GPU: its test at full size, then the
# kernel table (lite.kernels.bench: captured graphs, weights rotated past the L2) beside IQ3_XXS_G4's mv_iq2.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 300 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 2>&1 | tail -14
