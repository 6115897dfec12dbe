#!/usr/bin/env bash
# Session 7, call 4 (carry .whl): mvq the default for dense Q4_K decode (LITE_MATVEC_Q8=1) and qx a
# thread a float4 (call 3's trace: 2.7 us a qx launch with a thread a chunk): the GPU tests with the
# new default, 8B decode A/B, the per-kernel trace, and the kernel table (lite.kernels.bench).
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1 ) &
SYN=$!
timeout 300 python3 -m pytest -q tests/test_matvec_q8_emulated.py tests/test_cuda_backend.py tests/test_matvec_epilogue.py \
    tests/test_kernels_matvec.py tests/test_experts_mvw.py tests/test_fold_norm.py tests/test_pdl.py > $O/tests.log 2>&1
grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -12
wait $SYN
b() {  # label depth env... file
  local f=${@: -1}; local d=$2; local envs=("${@:3:$#-3}")
  printf "%-26s " "$1"; env "${envs[@]}" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2; do
  b "8b q8 on (default)" 512 LITE_PDL=auto /tmp/8b.gguf
  b "8b q8 off" 512 LITE_MATVEC_Q8=0 /tmp/8b.gguf
done | tee $O/ab8b.log
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 150 $NCU --profile-from-start off --graph-profiling node --clock-control none \
    --cache-control none --metrics gpu__time_duration.sum --csv python3 scripts/trace_decode.py /tmp/8b.gguf 512 1 \
    > $O/k_q8.csv 2>/dev/null
python3 scripts/trace_decode.py --summary $O/k_q8.csv 1 | head -8
timeout 120 python3 -m lite.kernels.bench --no-numba Q4_K Q6_K Q8_0 IQ3_XXS > $O/kbench.log 2>&1; grep "|" $O/kbench.log | grep -v "768x2048"
