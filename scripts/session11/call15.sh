# Session 11, call 15: the kernel table with IQ3_XXS_G4's prefetch 2 (the default after call 14).
source scripts/device_setup.sh >/dev/null 2>&1; timeout 150 python3 -m lite.kernels.bench --no-numba IQ3_XXS_G4 Q4_K 2>&1 | grep -E "copy|matvec|dequant" | grep -E "copy|4096x14336|14336x4096|4096x4096"
