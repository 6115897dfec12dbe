# Session 12, call 19: kernels/matvec_mma.py's mvb in mvx's form (half the lookups conflict-free, a CTA a
# band, (8, 1)): its GPU test, the A/B beside mv_iq2 (alone / after qx / after qxe), the kernel table twice.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 200 python3 scripts/session12/mvb_ab.py 2>&1 | tail -3
for i in 1 2; do timeout 200 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 2>&1 | grep "copy-vec16\|matvec"; done
