#!/usr/bin/env bash
# Session 4, device call 3 (carry .whl; /tmp/llb/llama-bench copied by the call before): GPU tests of
# the two new defaults (pinned graph I/O, qwen3 q/k norms folded), the llama.cpp peer on the 8B Q4_K
# and the 30B-A3B IQ3_XXS files, lite's MoE decode with the new defaults. Results under $OUT.
set -u
source scripts/device_setup.sh 2>/dev/null
L="python3 -m lite.cli.main"; O=${OUT:-/tmp/out}; mkdir -p "$O"
log() { echo "== $(date +%T) $*" | tee -a "$O/call3.log"; }
log tests; python3 -m pytest -q tests/test_decode_io.py tests/test_cuda_decode.py 2>&1 | tail -3 | tee -a "$O/call3.log"
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
log peer 8b; timeout 150 /tmp/llb/llama-bench -m /tmp/8b.gguf -p 512,8192 -n 128 -fa 1 -ngl 99 -ub 512,2048 -r 3 -o md 2>&1 | tee "$O/peer_8b.md" | grep -E "^\|" | tail -6
log lite 8b; $L bench /tmp/8b.gguf -p 512,8192 -n 128 -r 3 --device cuda --prefill auto 2>&1 | tee "$O/lite_8b.txt" | tail -5
f=/tmp/qwen3moe-30b-a3b-IQ3_XXS.gguf
log synth IQ3_XXS; ( time $L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS $f ) 2>&1 | tail -3 | tee -a "$O/call3.log"
log peer moe gpu; timeout 150 /tmp/llb/llama-bench -m $f -p 2048,8192,32768 -n 128 -fa 1 -ngl 99 -ub 2048 -r 3 -o md 2>&1 | tee "$O/peer_moe_IQ3_XXS.md" | grep -E "^\|" | tail -4
log peer moe host; timeout 120 /tmp/llb/llama-bench -m $f -p 8192 -n 32 -fa 1 -ngl 99 -ncmoe 48 -ub 8192 -r 2 -o md 2>&1 | tee "$O/peer_moe_host_IQ3_XXS.md" | grep -E "^\|" | tail -2
log lite moe Q4_K decode; [ -f /tmp/30b.gguf ] || $L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null
$L bench /tmp/30b.gguf -p 2048 -n 128 -r 3 --device cuda 2>&1 | tail -3 | tee -a "$O/call3.log"
python3 scripts/profile_decode.py /tmp/30b.gguf 2048 2>&1 | tail -16 | tee "$O/profile_moe.txt"
log done
