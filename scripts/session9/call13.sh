#!/usr/bin/env bash
# Session 9, call 13 (warm after call 12): the 30B-A3B IQ3_XXS decode with and without the epilogues.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"
$L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS /tmp/30i.gguf >/dev/null 2>&1
for rep in 1 2; do
  for e in 1 0; do
    printf "30i epilogue=%s " $e; LITE_MATVEC_EPILOGUE=$e timeout 70 $L bench /tmp/30i.gguf -p 2048 -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128" | awk -F'|' '{print $(NF-1)}'
  done
done | tee ${OUT:-/tmp}/ab30.log
