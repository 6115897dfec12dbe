#!/usr/bin/env bash
# Session 7, call 8 (carry .whl): Q6_K on mvq (TQ6_KQ: x in two int8 parts, its sums by 8 for the
# -32 offset; opt-in LITE_MATVEC_Q8=Q4_K,Q6_K) and the quantized-x sums (minimums and offset meet
# the quantized x): GPU tests, the Q6_K sweep (the 8B's output head is Q6_K, 128256x4096: 6% of a
# step), 8B decode A/B, and the kernel table with it.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1 ) &
SYN=$!
LITE_MATVEC_Q8=Q4_K,Q6_K timeout 200 python3 -m pytest -q tests/test_matvec_q8_emulated.py tests/test_cuda_backend.py \
    -k "q8 or mvq or qwen3 or Q6_K or folded or virtual or epilogues" > $O/tests.log 2>&1
grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -8
timeout 120 python3 tests/gpu_sweep_matvec.py --types Q6_K --variants mvq20,mvq40,mvq41,mvq80 \
    --shapes 4096x14336,14336x4096,4096x4096,128256x4096 > $O/sweep_q6k.log 2>&1; cat $O/sweep_q6k.log
wait $SYN
b() {  # label depth env... file
  local f=${@: -1}; local d=$2; local envs=("${@:3:$#-3}")
  printf "%-26s " "$1"; env "${envs[@]}" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2; do
  b "8b q8 Q4_K (default)" 512 LITE_PDL=auto /tmp/8b.gguf
  b "8b q8 Q4_K,Q6_K" 512 LITE_MATVEC_Q8=Q4_K,Q6_K /tmp/8b.gguf
done | tee $O/ab8b.log
LITE_MATVEC_Q8=Q4_K,Q6_K timeout 100 python3 -m lite.kernels.bench --no-numba Q4_K Q6_K > $O/kbench.log 2>&1; grep "|" $O/kbench.log | grep -v "768x2048"
