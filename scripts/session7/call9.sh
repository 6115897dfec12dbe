#!/usr/bin/env bash
# Session 7, call 9 (carry .whl): mvq's tests with the quantization bound in the tolerance (call 8:
# the Q6_K full-size test exceeded 1e-5 of sum |w||x| on x with 100x spikes every 7th value), and
# the 8B decode A/B with Q6_K's output head on mvq at 4 rows a CTA.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1 ) &
SYN=$!
LITE_MATVEC_Q8=Q4_K,Q6_K timeout 150 python3 -m pytest -q tests/test_matvec_q8_emulated.py tests/test_cuda_backend.py \
    -k "gpu_mvq or qwen3-Q6_K or epilogues_equal" > $O/tests.log 2>&1
grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -8
wait $SYN
b() {  # label depth env... file
  local f=${@: -1}; local d=$2; local envs=("${@:3:$#-3}")
  printf "%-26s " "$1"; env "${envs[@]}" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2 3; do
  b "8b q8 Q4_K (default)" 512 LITE_PDL=auto /tmp/8b.gguf
  b "8b q8 Q4_K,Q6_K (4,0)" 512 LITE_MATVEC_Q8=Q4_K,Q6_K /tmp/8b.gguf
done | tee $O/ab8b.log
