#!/usr/bin/env bash
# Session 6, call 6 (carry .whl; /tmp/llb/llama-bench copied by call 5): the new defaults (Q4_K's
# two-instruction dot everywhere; moe_mvw's gated (16, 2, 4) and the IQ3 grid read through L1)
# through the GPU tests, with garbage collection held off during graph capture (the flake of calls
# 2 and 4); then decode A/Bs against the old settings, and llama.cpp on the same files.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS /tmp/30i.gguf >/dev/null 2>&1
  $L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1
  $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1 ) &
SYN=$!
timeout 200 python3 -m pytest -q tests/test_cuda_backend.py tests/test_experts_mvw.py > $O/tests1.log 2>&1; tail -3 $O/tests1.log
timeout 100 python3 -m pytest -q tests/test_cuda_backend.py -k "epilogues or programmatic or both_q4k or grid_copies or gated" > $O/tests2.log 2>&1; tail -3 $O/tests2.log
wait $SYN
b() {  # label depth reps env... file
  local f=${@: -1}; local d=$2 r=$3; local envs=("${@:4:$#-4}")
  printf "%-40s " "$1"; env "${envs[@]}" $L bench $f -p $d -n 128 -r $r --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
OLD=(LITE_MOE_MVW="2048=16,4,2" LITE_IQ3_GCOPIES=8)
for rep in 1 2; do
  b "iq3 new" 2048 3 LITE_PDL=auto /tmp/30i.gguf
  b "iq3 old (16,4,2; 8 grid copies)" 2048 3 "${OLD[@]}" /tmp/30i.gguf
done
b "iq3 new" 2048 3 LITE_PDL=auto /tmp/30i.gguf
for rep in 1 2; do
  b "q4k new" 2048 3 LITE_PDL=auto /tmp/30b.gguf
  b "q4k old (16,4,2)" 2048 3 LITE_MOE_MVW="2048=16,4,2" /tmp/30b.gguf
done
for rep in 1 2; do
  b "8b new (mvf)" 512 5 LITE_PDL=auto /tmp/8b.gguf
  b "8b Q4_K=mv" 512 5 LITE_MATVEC_CONFIG=Q4_K=mv /tmp/8b.gguf
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
for f in 30i:2048 30b:2048 8b:512; do
  echo "llama.cpp ${f%%:*} d${f##*:}"
  timeout 100 /tmp/llb/llama-bench -m /tmp/${f%%:*}.gguf -p 0 -n 128 -d ${f##*:} -fa 1 -ngl 99 -r 3 -o md 2>&1 | grep -E "^\||error|invalid" | tail -1
done
