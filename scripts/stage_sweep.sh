#!/usr/bin/env bash
# Issue #5's table: the 8B synthetic file with 1, 2 and 4 virtual stages on one GPU, --prefill auto
# against fixed chunks, prompts of 8K to 64K (run on the GPU machine after
# `source scripts/device_setup.sh`). One model load per stage count; -r 1 after a warm-up run,
# to fit the device time of a session. Output in ${OUT:-/tmp/lite-sweep}/sweep.log.
set -u
out=${OUT:-/tmp/lite-sweep}; mkdir -p "$out"
L="python3 -m lite.cli.main"
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf 2>&1 | tail -1
run() { echo "\$ lite $*" | tee -a "$out/sweep.log"; $L "$@" 2>&1 | grep -v "^|--" | tee -a "$out/sweep.log"; }
B="bench /tmp/8b.gguf -n 0 -r 1 --device cuda"
run $B -p 8192,32768 --prefill auto,1024,2048,4096,8192
run $B -p 8192,32768 --prefill auto,2048 --layer-split 2
run $B -p 8192,32768 --prefill auto,1024,2048,4096,8192 --layer-split 4
# host and device time per stage-chunk, 1 and 4 stages
run $B -p 8192 --prefill 2048 --timeline "$out/timeline_1stage.json"
run $B -p 8192 --prefill 2048 --layer-split 4 --timeline "$out/timeline_4stages.json"
run $B -p 65536 --prefill auto,2048
