#!/usr/bin/env bash
# Session 4, device call 8 (carry .whl): the new defaults (norm split across the products, gate/up
# rows alternating, the virtual-stage test with the norm split) on the GPU: tests, the 8B Q4_K
# figures (peer: call 3), profile, 30B-A3B decode.
set -u
source scripts/device_setup.sh 2>/dev/null
L="python3 -m lite.cli.main"; O=${OUT:-/tmp/out}; mkdir -p "$O"
log() { echo "== $(date +%T) $*" | tee -a "$O/call8.log"; }
$L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
log tests; python3 -m pytest -q tests/test_cuda_backend.py tests/test_decode_io.py tests/test_experts_mvw.py 2>&1 | tail -3 | tee -a "$O/call8.log"
log lite 8b; $L bench /tmp/8b.gguf -p 512,8192,32768 -n 128 -r 3 --device cuda --prefill auto 2>&1 | tee "$O/lite_8b.txt" | tail -7
python3 scripts/profile_decode.py /tmp/8b.gguf 512 2>&1 | tail -12 | tee "$O/profile_8b.txt"
$L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1
log moe; $L bench /tmp/30b.gguf -p 2048 -n 128 -r 3 --device cuda 2>&1 | tail -2 | tee -a "$O/call8.log"
log done
