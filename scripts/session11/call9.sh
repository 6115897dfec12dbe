# Session 11, call 9: the GPU tests that run qx (now qx_one inside qx: the default kernels' text moved)
# and mvt's, then the kernel table of IQ3_XXS_G4 and Q4_K (should be unchanged).
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 -m pytest -q tests/test_matvec_q8_emulated.py tests/test_matvec_q8_iq3_emulated.py tests/test_kernels_matvec.py 2>&1 | tail -3
timeout 200 python3 -m pytest -q tests/test_cuda_backend.py -k "iq3 or IQ3 or q4k or Q4_K" 2>&1 | tail -3
timeout 100 python3 -m lite.kernels.bench --no-numba IQ3_XXS_G4 Q4_K 2>&1 | tail -12
