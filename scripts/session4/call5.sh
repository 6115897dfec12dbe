#!/usr/bin/env bash
# Session 4, device call 5 (carry .whl): the RMSNorm split across the products (LITE_FOLD_NORM=1,
# second design) on the GPU: tests, A/B, profile; IQ3_XXS experts' gathered prefill dequantize:
# tests and issue 6's host rows again (25% / 50% caches). Results under $OUT.
set -u
source scripts/device_setup.sh 2>/dev/null
L="python3 -m lite.cli.main"; O=${OUT:-/tmp/out}; mkdir -p "$O"
log() { echo "== $(date +%T) $*" | tee -a "$O/call5.log"; }
$L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
log tests; python3 -m pytest -q tests/test_cuda_backend.py tests/test_kernels_matvec.py tests/test_experts_iq.py tests/test_experts.py 2>&1 | tail -4 | tee -a "$O/call5.log"
for f in 0 1 0 1; do log "fold $f"; LITE_FOLD_NORM=$f $L bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | tail -1 | tee -a "$O/call5.log"; done
LITE_FOLD_NORM=1 python3 scripts/profile_decode.py /tmp/8b.gguf 512 2>&1 | tail -12 | tee "$O/profile_fold.txt"
f=/tmp/qwen3moe-30b-a3b-IQ3_XXS.gguf
$L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS $f >/dev/null 2>&1
for c in 2.584 5.168; do log "IQ3_XXS host cache $c GiB"
  $L bench $f -p 2048,8192,32768 -n 32 -r 2 --device cuda --prefill 8192 --experts host --expert-cache $c 2>&1 | tail -6 | tee -a "$O/call5.log"; done
log done
