# Session 14, call 5: mvb with -x's words from qxe<.., 26> (no __vsub4) and the scales as 2 sc + 1 bytes a block,
# against call 4's and session 13's texts; its GPU tests; the kernel table's IQ3_XXS_B16 row.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -3
timeout 300 python3 scripts/session14/mvb_ab14.py --timeline 2>&1 | tail -32
timeout 150 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 2>&1 | grep "copy-vec16\|matvec"
