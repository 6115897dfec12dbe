# Session 13, call 10: mvb<W, P> back to static tables (call 9 lost), beside call 8's S = 0 form and against
# session 12's (scripts/session13/mvb_final.py); the GPU test; the kernel table (IQ3_XXS_B16 beside IQ3_XXS_G4).
source scripts/device_setup.sh >/dev/null 2>&1
timeout 120 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 300 python3 scripts/session13/mvb_final.py 2>&1 | tail -24
timeout 150 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 2>&1 | grep "copy-vec16\|matvec"
