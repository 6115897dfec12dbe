# Session 14, call 1: the all-grid mvb (every chunk's words from the grid's copies) against session 13's text,
# the GPU tests of the layout (mvb at full size, the registry), then the kernel table's B16 row.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 150 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -1
timeout 300 python3 scripts/session14/mvb_ab14.py --timeline 2>&1 | tail -34
timeout 120 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 2>&1 | grep "copy-vec16\|matvec"
