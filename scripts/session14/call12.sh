# Session 14, call 12: config takes SG = 1 (the signs by an add) at 4 warps a CTA; the S = 2 split removed. The GPU
# tests, today's forms against session 13's text, the kernel table's IQ3_XXS_B16 row.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 200 python3 scripts/session14/mvb_ab14.py 2>&1 | tail -12
timeout 120 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 2>&1 | grep "copy-vec16\|matvec"
