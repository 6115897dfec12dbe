#!/usr/bin/env bash
# Session 7, call 2 (carry .whl): Q4_K on dp4a over x in two int8 parts (kernels/matvec_q8.py, mvq,
# first GPU run): its GPU test, then the sweep beside mv / mvf at several CTA shapes (mvqRP = the
# quantizer + the product, mvqRPp = the product alone); Q6_K's CTA shapes; IQ3_XXS v2 (8 rows,
# tables through L1: fastest in call 1's sweep) end to end on the 8B IQ3_XXS file; the kernel table.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf >/dev/null 2>&1 ) &
SYN=$!
timeout 240 python3 -m pytest -q tests/test_matvec_q8_emulated.py > $O/tests_q8.log 2>&1; tail -3 $O/tests_q8.log
timeout 150 python3 tests/gpu_sweep_matvec.py --types Q4_K \
    --variants mvf80,mvf40,mvf41,mvf20,mvf160,mvq80,mvq40,mvq41,mvq20,mvq160 \
    --shapes 4096x14336,6144x4096,28672x4096,4096x4096 > $O/sweep_q4k.log 2>&1; cat $O/sweep_q4k.log; cp $O/sweep.json $O/sweep_q4k.json 2>/dev/null
timeout 90 python3 tests/gpu_sweep_matvec.py --types Q6_K --variants mv80,mv81,mv41,mv20 \
    --shapes 4096x14336,6144x4096,4096x4096 > $O/sweep_q6k.log 2>&1; cat $O/sweep_q6k.log
wait $SYN
b() {  # label env... file
  local f=${@: -1}; local envs=("${@:2:$#-2}")
  printf "%-30s " "$1"; env "${envs[@]}" $L bench $f -p 512 -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2; do
  b "8b IQ3_XXS default" LITE_PDL=auto /tmp/8i.gguf
  b "8b IQ3_XXS v2,8,0" LITE_IQ_MV=v2,8,0 /tmp/8i.gguf
done | tee $O/iq3_ab.log
timeout 150 python3 -m lite.kernels.bench --no-numba Q4_K Q6_K Q8_0 IQ3_XXS > $O/kbench.log 2>&1; grep "|" $O/kbench.log | tail -40
