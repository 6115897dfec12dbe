# Session 13, call 14: mvb's weights through L2 with an evict-first policy (the default now) against plain loads
# (scripts/session13/mvb_evict.py); the GPU test; the kernel table with it.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 120 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -1
timeout 200 python3 scripts/session13/mvb_evict.py 2>&1 | tail -12
timeout 150 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 2>&1 | grep "copy-vec16\|matvec"
