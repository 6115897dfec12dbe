#!/usr/bin/env bash
# Issue 7 on a machine with 2+ GPUs (after `source scripts/device_setup.sh`): byte identity across
# GPUs, then the 8B synthetic file with one stage per GPU (chain vs sync, auto vs fixed chunks) beside
# one GPU, and the timeline of a 32K prompt. Output in ${OUT:-/tmp/lite-multi}/multi.log.
set -u
out=${OUT:-/tmp/lite-multi}; mkdir -p "$out"
L="python3 -m lite.cli.main"
n=$(nvidia-smi -L | wc -l); devs=$(seq -s, 0 $((n - 1)))
nvidia-smi topo -m 2>&1 | head -4 | tee -a "$out/multi.log"
python3 -m pytest -q tests/test_multi_gpu.py 2>&1 | tail -2 | tee -a "$out/multi.log"
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf 2>&1 | tail -1
run() { echo "\$ lite $*" | tee -a "$out/multi.log"; $L "$@" 2>&1 | grep -v "^|--" | tee -a "$out/multi.log"; }
B="bench /tmp/8b.gguf -r ${REPS:-2} --device cuda"
run $B -p 512,8192,32768 -n 128 --prefill 2048
run $B -p 8192,32768 -n 32 --prefill auto,2048,4096 --devices $devs
run $B -p 8192,32768 -n 0 --prefill 2048 --devices $devs --pipeline sync
run $B -p 32768 -n 0 -r 1 --prefill 2048 --devices $devs --timeline "$out/timeline_32k_${n}gpu.json"
