# Session 13, call 12: the GPU tests of what the session touched (matvec_q8's quantizer text: lt_q8w / qx_one's
# RW = 18; matvec_tma's helpers split into C_BULK; mvb), the IQ3_XXS and Q4_K backend tests, the kernel table.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 250 python3 -m pytest -q tests/test_matvec_mma_emulated.py tests/test_matvec_q8_emulated.py \
    tests/test_matvec_q8_iq3_emulated.py tests/test_kernels_iq.py 2>&1 | tail -3
timeout 200 python3 -m pytest -q tests/test_cuda_backend.py -k "IQ3 or iq3 or q4k" 2>&1 | tail -3
timeout 150 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 2>&1 | grep "copy-vec16\|matvec"
