#!/usr/bin/env bash
# Session 6, call 10 (carry .whl): the dense IQ3_XXS decode kernels with the grid read through L1
# (LITE_IQ3_GCOPIES=0) against 8 shared copies (their default): the sweep (register kernel and the
# persistent mvp8, the decode default) and an 8B IQ3_XXS decode A/B.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf >/dev/null 2>&1 ) &
SYN=$!
for gc in 8 0; do
  echo "== LITE_IQ3_GCOPIES=$gc"
  LITE_IQ3_GCOPIES=$gc timeout 100 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvp8 2>&1 | grep -E "copy|IQ3_XXS|MISMATCH|mismatches"
done
wait $SYN
for rep in 1 2; do
  for gc in 8 0; do
    printf "8b IQ3_XXS gc%s " $gc
    LITE_IQ3_GCOPIES=$gc $L bench /tmp/8i.gguf -p 512 -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
  done
done
