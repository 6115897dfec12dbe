#!/usr/bin/env bash
# Session 6, call 11 (carry .whl): LITE_MATVEC_SPREAD (matvec_staged.spread_smem, opt-in, NOT KEPT:
# it changed nothing, BENCHMARKS session 6): grids under a wave held to ceil(CTAs / SMs) CTAs an SM
# by padding dynamic shared memory (pad = ceil((smem_per_SM // (k + 1) + 1 - 1024 - static) / 128)
# * 128, k = ceil(CTAs / SMs), only where k < 6), in mv/mvf and mve launches; the sweep's --spread
# timed the register kernels with it (labels ending in s). Kept as the record of the call.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
( $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1 ) &
SYN=$!
timeout 120 python3 tests/gpu_sweep_matvec.py --types Q4_K,Q6_K --variants mvf80 --spread \
    --shapes 6144x4096,28672x4096,4096x4096,4096x14336 2>&1 | grep -E "copy|Q4_K |Q6_K |MISMATCH|mismatches"
wait $SYN
for rep in 1 2; do
  for sp in 0 1; do
    printf "8b LITE_MATVEC_SPREAD=%s " $sp
    LITE_MATVEC_SPREAD=$sp timeout 60 $L bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | grep -E "tg128|rror" | awk -F'|' '{print $(NF-1)}'
  done
done
