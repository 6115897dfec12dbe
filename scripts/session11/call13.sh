# Session 11, call 13: IQ3_XXS_G4's products with prefetch 2 (mv_rows: a row's last half trip over all
# 128 threads; the default now, LITE_IQ3_HALVES=0 the old): the sweep at three shapes, the GPU tests
# that run IQ3_XXS_G4 products (mv_iq2 and the epilogue kernels mve), the kernel table, then 8B IQ3_XXS
# decode A/B (tg128 after 512, -r 3; 0/1 alternating, twice).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf >/dev/null 2>&1 ) &
timeout 100 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvq40g12,mvq42g12 --shapes 4096x14336,14336x4096,4096x4096 2>&1 | grep -v "^  IQ3" | tr '|' '\n'
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_iq.py tests/test_matvec_q8_iq3_emulated.py \
    tests/test_cuda_backend.py -k "IQ3 or iq3 or regroup or epilogue" 2>&1 | tail -3
timeout 60 python3 -m lite.kernels.bench --no-numba IQ3_XXS_G4 2>&1 | grep -E "copy-vec16|matvec"
wait
for rep in 1 2; do for h in 0 1; do
  printf "LITE_IQ3_HALVES=%s " $h; LITE_IQ3_HALVES=$h timeout 120 $L bench /tmp/8i.gguf -p 512 -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128" | awk -F'|' '{print $(NF-1)}'
done; done
