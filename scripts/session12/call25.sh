# Session 12, call 25: kernels/matvec_mma.py with config(rows, cols, SMs) (4 warps where the bands pass 2
# CTAs an SM): the GPU test, the kernel table.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 200 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 2>&1 | grep "copy-vec16\|matvec"
