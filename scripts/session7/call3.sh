#!/usr/bin/env bash
# Session 7, call 3 (carry .whl): LITE_MATVEC_Q8=1 (every dense Q4_K decode product on mvq: x
# quantized in two int8 parts, dp4a, 2 rows a CTA) through the GPU tests, then decode A/Bs on the
# 8B and 30B-A3B Q4_K files, the per-kernel trace of the 8B step with it, and the kernel table row.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
  $L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1 ) &
SYN=$!
LITE_MATVEC_Q8=1 timeout 200 python3 -m pytest -q tests/test_matvec_q8_emulated.py tests/test_cuda_backend.py \
    tests/test_matvec_epilogue.py > $O/tests_q8on.log 2>&1; tail -4 $O/tests_q8on.log
wait $SYN
b() {  # label depth env... file
  local f=${@: -1}; local d=$2; local envs=("${@:3:$#-3}")
  printf "%-26s " "$1"; env "${envs[@]}" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2; do
  b "8b q8 off" 512 LITE_MATVEC_Q8=0 /tmp/8b.gguf
  b "8b q8 on" 512 LITE_MATVEC_Q8=1 /tmp/8b.gguf
done | tee $O/ab8b.log
for rep in 1 2; do
  b "30b q8 off" 2048 LITE_MATVEC_Q8=0 /tmp/30b.gguf
  b "30b q8 on" 2048 LITE_MATVEC_Q8=1 /tmp/30b.gguf
done | tee $O/ab30b.log
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
LITE_MATVEC_Q8=1 timeout 150 $NCU --profile-from-start off --graph-profiling node --clock-control none \
    --cache-control none --metrics gpu__time_duration.sum --csv python3 scripts/trace_decode.py /tmp/8b.gguf 512 1 \
    > $O/k_q8.csv 2>/dev/null
python3 scripts/trace_decode.py --summary $O/k_q8.csv 1 | head -14
LITE_MATVEC_Q8=1 timeout 60 python3 -m lite.kernels.bench --no-numba Q4_K > $O/kbench_q8.log 2>&1; grep "|" $O/kbench_q8.log
