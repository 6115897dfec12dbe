#!/usr/bin/env bash
# The GPU benchmark behind BENCHMARKS.md (run on the GPU machine after `source tools/device_setup.sh`).
# Writes to ${OUT:-/tmp/lite-bench}: tests.log, bench.log, timeline_4stages.json.
set -u
out=${OUT:-/tmp/lite-bench}; mkdir -p "$out"
L="python3 -m lite.cli.main"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/bench.log"
python3 -m pytest -q tests/test_cuda_backend.py 2>&1 | tail -3 | tee "$out/tests.log"
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf 2>&1 | tail -1
run() { echo "\$ lite $*" | tee -a "$out/bench.log"; $L "$@" 2>&1 | tee -a "$out/bench.log"; }
run bench /tmp/8b.gguf -p 512,2048,8192 -n 128 -r 3 --device cuda --prefill 2048
run bench /tmp/8b.gguf -p 32768 -n 32 -r 2 --device cuda --prefill 2048
run bench /tmp/8b.gguf -p 8192 -n 32 -r 2 --device cuda --prefill 2048 --layer-split 2
run bench /tmp/8b.gguf -p 8192 -n 32 -r 2 --device cuda --prefill 2048 --layer-split 4 --timeline "$out/timeline_4stages.json"
run bench /tmp/8b.gguf -p 8192 -n 0 -r 2 --device cuda --prefill 2048 --layer-split 4 --pipeline sync
run bench /tmp/8b.gguf -p 8192 -n 0 -r 2 --device cuda --prefill auto --layer-split 4
run bench /tmp/8b.gguf -p 8192 -n 0 -r 2 --device cuda --prefill 1024
run bench /tmp/8b.gguf -p 8192 -n 128 -r 2 --device cuda --prefill 2048 --kv int8
