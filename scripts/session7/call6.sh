#!/usr/bin/env bash
# Session 7, call 6 (carry .whl; /tmp/llb/llama-bench copied by call 5; /tmp/8b.gguf from call 4
# on the same warm machine): the two tests call 4 failed, mended (the float kernel's twin test pins
# the float path; path-identity tolerance 2e-4 of the max logit with mvq); llama.cpp on the same 8B
# file; 30B-A3B Q4_K decode A/B with the faster qx.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
( $L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1 ) &
SYN=$!
timeout 150 python3 -m pytest -q tests/test_cuda_backend.py tests/test_kernels_matvec.py \
    -k "folded_norms or virtual_stages or full_size or epilogues_equal or both_q4k" > $O/tests.log 2>&1
grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -6
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout 120 /tmp/llb/llama-bench -m /tmp/8b.gguf -p 0 -n 128 -d 512 -fa 1 -ngl 99 -r 3 -o md 2>&1 | grep -E "\| (model|llama)" | tee $O/llamacpp_8b.log
wait $SYN
b() {  # label depth env... file
  local f=${@: -1}; local d=$2; local envs=("${@:3:$#-3}")
  printf "%-26s " "$1"; env "${envs[@]}" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2; do
  b "30b q8 on (default)" 2048 LITE_PDL=auto /tmp/30b.gguf
  b "30b q8 off" 2048 LITE_MATVEC_Q8=0 /tmp/30b.gguf
done | tee $O/ab30b.log
