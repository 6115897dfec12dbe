# Session 13, call 1: mvb with B bands a CTA (kernels/matvec_mma.py): the GPU test, the timings and the
# timeline (scripts/session13/mvb_bands.py), the kernel table.
source scripts/device_setup.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -3
timeout 240 python3 scripts/session13/mvb_bands.py 2>&1 | tail -80
timeout 120 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 2>&1 | grep "copy-vec16\|matvec"
