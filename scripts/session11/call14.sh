# Session 11, call 14: prefetch 2 as mv_rows_any (mv_rows<P = 0> called as it is, then the half trip:
# call 13's fold into the loop changed the loop's code and lost); the sweep twice, the GPU tests of
# IQ3_XXS_G4's products, the 8B IQ3_XXS decode A/B (LITE_IQ3_HALVES=0 the old default).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf >/dev/null 2>&1 ) &
for i in 1 2; do timeout 100 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvq40g12,mvq42g12 --shapes 4096x14336,14336x4096,4096x4096 2>&1 | grep -v "^  IQ3" | tr '|' '\n'; done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_matvec_q8_iq3_emulated.py tests/test_cuda_backend.py -k "IQ3 or iq3 or regroup or epilogue" 2>&1 | tail -2
wait
for rep in 1 2; do for h in 0 1; do
  printf "LITE_IQ3_HALVES=%s " $h; LITE_IQ3_HALVES=$h timeout 120 $L bench /tmp/8i.gguf -p 512 -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128" | awk -F'|' '{print $(NF-1)}'
done; done
