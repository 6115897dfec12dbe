# Session 14, call 10: at the session's last kernel text, mvb's GPU tests and issue 3's whole kernel table.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 380 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 IQ3_XXS Q4_K Q6_K Q8_0 2>&1 | grep "copy-vec16\|matvec\|dequant"
