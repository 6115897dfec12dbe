#!/usr/bin/env bash
# Session 4, device call 6 (carry .whl): LITE_FOLD_NORM=1 with one scale a token from the producer's
# last CTA: GPU tests, A/B, profile; the gated product with gate/up rows interleaved (bench_gated.py).
set -u
source scripts/device_setup.sh 2>/dev/null
L="python3 -m lite.cli.main"; O=${OUT:-/tmp/out}; mkdir -p "$O"
log() { echo "== $(date +%T) $*" | tee -a "$O/call6.log"; }
$L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
log tests; python3 -m pytest -q tests/test_cuda_backend.py -k "folded or epilogue" tests/test_cuda_decode.py 2>&1 | tail -3 | tee -a "$O/call6.log"
log gated; python3 scripts/session4/bench_gated.py 2>&1 | tail -12 | tee -a "$O/call6.log"
for f in 0 1 0 1; do log "fold $f"; LITE_FOLD_NORM=$f $L bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | tail -1 | tee -a "$O/call6.log"; done
LITE_FOLD_NORM=1 python3 scripts/profile_decode.py /tmp/8b.gguf 512 2>&1 | tail -12 | tee "$O/profile_fold.txt"
log done
