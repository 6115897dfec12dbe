# Session 14, call 4: mvb<W, P, A> (A = 1: the signed table 16 KB aligned in dynamic shared memory, config's choice
# where the CTAs fit one round) -- its GPU tests (full size, the registry, B16's dequantize), the A/B against session
# 13's text, and the kernel table's IQ3_XXS rows.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -3
timeout 300 python3 scripts/session14/mvb_ab14.py --timeline 2>&1 | tail -32
timeout 150 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 2>&1 | grep "copy-vec16\|matvec"
