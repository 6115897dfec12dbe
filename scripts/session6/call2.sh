#!/usr/bin/env bash
# Session 6, call 2: mvf (Q4_K's two-instruction dot, now the default) and the IQ3 grid-copies knob
# through the GPU tests; then IQ3_XXS MoE decode A/Bs of moe_mvw's shapes (LITE_MOE_MVW) and the
# grid's shared copies (LITE_IQ3_GCOPIES), and the Q4_K 30B-A3B with the R=4 shapes.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS /tmp/30i.gguf >/dev/null 2>&1
  $L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1 ) &
SYN=$!
timeout 240 python3 -m pytest -q -x tests/test_cuda_backend.py tests/test_experts_mvw.py 2>&1 | tail -8
wait $SYN
b() {  # label env... file
  local f=${@: -1}; local envs=("${@:2:$#-2}")
  printf "%-44s " "$1"; env "${envs[@]}" $L bench $f -p 2048 -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
S1="2048=16,2,4;768=8,3,4"
for rep in 1 2; do
  b "iq3 default" LITE_PDL=auto /tmp/30i.gguf
  b "iq3 $S1" LITE_MOE_MVW=$S1 /tmp/30i.gguf
  b "iq3 $S1 gc0" LITE_MOE_MVW=$S1 LITE_IQ3_GCOPIES=0 /tmp/30i.gguf
  b "iq3 $S1 gc2" LITE_MOE_MVW=$S1 LITE_IQ3_GCOPIES=2 /tmp/30i.gguf
  b "iq3 default gc0" LITE_IQ3_GCOPIES=0 /tmp/30i.gguf
done
for m in "2048=16,2,4;768=8,3,2" "2048=16,1,4;768=8,3,4" "2048=32,2,4;768=8,3,4" "2048=16,2,4;768=8,2,4" "2048=16,2,4;768=8,1,4"; do
  b "iq3 $m" LITE_MOE_MVW=$m /tmp/30i.gguf
  b "iq3 $m gc0" LITE_MOE_MVW=$m LITE_IQ3_GCOPIES=0 /tmp/30i.gguf
done
for rep in 1 2; do
  b "q4k default" LITE_PDL=auto /tmp/30b.gguf
  b "q4k $S1" LITE_MOE_MVW=$S1 /tmp/30b.gguf
  b "q4k Q4_K=mv" LITE_MATVEC_CONFIG=Q4_K=mv /tmp/30b.gguf
done
