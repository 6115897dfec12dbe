#!/usr/bin/env bash
# Session 5, call 5: moe_combine a thread a column, the residual add inside it by default, LITE_PDL
# as wait-then-trigger without prefetch, v2 attention by default at head dim 256: GPU tests, then
# decode A/B (30B-A3B Q4_K and IQ3_XXS, LITE_PDL 0/1; 8B as a check).
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
t() { echo "\$ $*"; "$@" 2>&1 | tail -${TAIL:-3}; }
t python3 -m pytest -q tests/test_cuda_backend.py -k "qwen3moe or programmatic or gemma3 or moe_fold"
t python3 -m pytest -q tests/test_experts_mvw.py tests/test_expert_devcache.py tests/test_expert_residency.py tests/test_experts.py
t python3 -m pytest -q tests/test_cuda_decode.py
$L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
$L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1
$L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS /tmp/30i.gguf >/dev/null 2>&1
for p in 0 1 0 1; do echo "LITE_PDL=$p 30b Q4_K"; LITE_PDL=$p $L bench /tmp/30b.gguf -p 2048 -n 128 -r 3 --device cuda 2>&1 | tail -1; done
for p in 0 1; do echo "LITE_PDL=$p 30b IQ3_XXS"; LITE_PDL=$p $L bench /tmp/30i.gguf -p 2048 -n 128 -r 3 --device cuda 2>&1 | tail -1; done
for p in 0 1; do echo "LITE_PDL=$p 8b"; LITE_PDL=$p $L bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | tail -1; done
python3 scripts/profile_decode.py /tmp/30b.gguf 2048 2>&1 | head -1
