#!/usr/bin/env bash
# Session 7, call 10 (carry .whl): LITE_Q8_EARLY=1 (mvq's first trip of weights loaded before the
# PDL wait for its quantizer; default kernels' SASS unchanged, checked with nvcc 13 locally): GPU
# tests, the sweep and the kernel table row with it and without, 8B decode A/B.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1 ) &
SYN=$!
LITE_Q8_EARLY=1 timeout 100 python3 -m pytest -q tests/test_matvec_q8_emulated.py tests/test_cuda_backend.py \
    -k "gpu_mvq or epilogues_equal or folded" > $O/tests.log 2>&1
grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -6
for ew in 0 1; do
  LITE_Q8_EARLY=$ew timeout 60 python3 tests/gpu_sweep_matvec.py --types Q4_K --variants mvq20 \
      --shapes 4096x14336,14336x4096,28672x4096 2>&1 | grep -E "^Q4_K|mismatch" | sed "s/^/EARLY=$ew /"
done | tee $O/sweep.log
wait $SYN
b() {  # label env... file
  local f=${@: -1}; local envs=("${@:2:$#-2}")
  printf "%-22s " "$1"; env "${envs[@]}" $L bench $f -p 512 -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2; do
  b "8b early 0" LITE_Q8_EARLY=0 /tmp/8b.gguf
  b "8b early 1" LITE_Q8_EARLY=1 /tmp/8b.gguf
done | tee $O/ab8b.log
LITE_Q8_EARLY=1 timeout 40 python3 -m lite.kernels.bench --no-numba Q4_K > $O/kbench.log 2>&1; grep "matvec" $O/kbench.log
