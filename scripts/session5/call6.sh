#!/usr/bin/env bash
# Session 5, call 6 (carry .whl; /tmp/llb/llama-bench copied by the call before): LITE_MOE_FOLD
# deleted, moe_mvw's gated form the default for decode's gate/up: GPU tests, A/B of the gated form
# (LITE_MOE_GATED 1/0) on the 30B-A3B Q4_K and IQ3_XXS files, llama.cpp's decode on the same files.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
t() { echo "\$ $*"; "$@" 2>&1 | tail -${TAIL:-3}; }
t python3 -m pytest -q tests/test_cuda_backend.py -k "qwen3moe or programmatic or gated"
t python3 -m pytest -q tests/test_experts_mvw.py tests/test_expert_devcache.py tests/test_expert_residency.py tests/test_experts.py
$L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1
$L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS /tmp/30i.gguf >/dev/null 2>&1
for g in 1 0 1 0; do echo "LITE_MOE_GATED=$g 30b Q4_K"; LITE_MOE_GATED=$g $L bench /tmp/30b.gguf -p 2048 -n 128 -r 3 --device cuda 2>&1 | tail -1; done
for g in 1 0; do echo "LITE_MOE_GATED=$g 30b IQ3_XXS"; LITE_MOE_GATED=$g $L bench /tmp/30i.gguf -p 2048 -n 128 -r 3 --device cuda 2>&1 | tail -1; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for f in 30b 30i; do
  echo "llama.cpp $f"; timeout 100 /tmp/llb/llama-bench -m /tmp/$f.gguf -p 0 -n 128 -fa 1 -ngl 99 -r 3 -o md 2>&1 | grep -E "^\|" | tail -1
  timeout 100 /tmp/llb/llama-bench -m /tmp/$f.gguf -p 0 -n 128 -d 2048 -fa 1 -ngl 99 -r 3 -o md 2>&1 | grep -E "^\||error|invalid" | tail -1
done
python3 scripts/profile_decode.py /tmp/30b.gguf 2048 2>&1 | head -1
