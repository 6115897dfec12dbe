# Session 12, call 22: mvb with its ring turned by unrolling (call 21's Nsight: each slot copy waited for the
# load just issued): the GPU test, the A/B beside mv_iq2, the kernel table.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 200 python3 scripts/session12/mvb_ab.py 2>&1 | tail -3
timeout 200 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 2>&1 | grep "copy-vec16\|matvec"
