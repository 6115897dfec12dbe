# Session 13, call 8: mvb<W, P, S> (a warp's first S blocks staged in shared memory by bulk copies before the
# PDL wait; x in layout 18 only) against S = 0 and session 12's text (scripts/session13/mvb_staged.py); the
# GPU test; the kernel table.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 120 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 300 python3 scripts/session13/mvb_staged.py 2>&1 | tail -36
timeout 120 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 2>&1 | grep "copy-vec16\|matvec"
