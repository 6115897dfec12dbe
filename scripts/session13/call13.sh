# Session 13, call 13: the kernel table with kernels/bench.py's graphs holding milliseconds of launches (its
# rate read 4e9 B/s: 11 launches a graph at 4096x14336 IQ3_XXS), issue 3's types.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 120 python3 -m pytest -q tests/test_bench_copy_emulated.py 2>&1 | tail -1
timeout 400 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 IQ3_XXS Q4_K Q6_K Q8_0 2>&1 | grep "|"
