#!/usr/bin/env bash
# Session 8, call 3 (carry .whl): the candidate defaults (record layout 1, Q6_K mvq at 2 rows a CTA,
# IQ3_XXS's TIQ3_XXSQV<1, 2>, the MoE experts on mvq) in decode against each old setting, after a
# sweep of the IQ3_XXS table variants that call 2 did not have (SC 3: one signed 16 KB table; 2 rows).
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
for a in "llama 8b Q4_K 8b" "llama 8b IQ3_XXS 8i" "qwen3moe 30b-a3b IQ3_XXS 30i" "qwen3moe 30b-a3b Q4_K 30b"; do
  set -- $a; ( $L synth --arch $1 --preset $2 --quant $3 /tmp/$4.gguf >/dev/null 2>&1 ) &
done
V=mvp8,mvq40t12,mvq20t12,mvq40t03,mvq20t03,mvqp4t03,mvq80t03,mvq40t02,mvq20t02
timeout 120 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants $V \
    --shapes 4096x14336,14336x4096,4096x4096 > $O/iq3.log 2>&1
grep -E "^IQ3|MISMATCH|mismatches" $O/iq3.log
timeout 60 python3 tests/gpu_sweep_matvec.py --types Q6_K --variants mvq20,mvq40 \
    --shapes 128256x4096,4096x4096 2>&1 | grep -E "^Q6_K|MISMATCH" | tee $O/q6.log
wait
b() {  # label depth file env...
  local lab=$1 d=$2 f=$3; shift 3
  printf "%-26s " "$lab"; env "$@" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2; do
  b "8b default" 512 /tmp/8b.gguf X=1
  b "8b layout0" 512 /tmp/8b.gguf LITE_Q8_LAYOUT=0
  b "8i default" 512 /tmp/8i.gguf X=1
  b "8i tables 0,0" 512 /tmp/8i.gguf LITE_IQ3_Q8=0,0
  b "30i default" 2048 /tmp/30i.gguf X=1
  b "30i moe_q8 0" 2048 /tmp/30i.gguf LITE_MOE_Q8=0
  b "30i tables 0,0" 2048 /tmp/30i.gguf LITE_IQ3_Q8=0,0
  b "30b default" 2048 /tmp/30b.gguf X=1
  b "30b layout0" 2048 /tmp/30b.gguf LITE_Q8_LAYOUT=0
done | tee $O/ab.log
