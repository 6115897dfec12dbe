#!/usr/bin/env bash
# Session 9, call 12 (carry .whl): IQ3_XXS on the decode epilogue kernels (residual add, gated
# activation over interleaved [gate; up], the split RMSNorm): call 11's trace showed the 8B IQ3_XXS
# step spending ~490 of 3,111 us in the separate rms_norm / add / silu_mul launches. GPU tests, then
# the 8B IQ3_XXS decode with and without the epilogues (LITE_MATVEC_EPILOGUE=0: as before).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf >/dev/null 2>&1 ) &
timeout 120 python3 -m pytest -q tests/test_cuda_backend.py -k "regroup or epilogues or folded" > $O/tests.log 2>&1
grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -8
wait
b() {  # label depth file env...
  local lab=$1 d=$2 f=$3; shift 3
  printf "%-16s " "$lab"; env "$@" timeout 60 $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128" | awk -F'|' '{printf "%s ", $(NF-1)} END {print ""}'
}
for rep in 1 2; do
  b "8i epilogues" 512 /tmp/8i.gguf X=1
  b "8i separate" 512 /tmp/8i.gguf LITE_MATVEC_EPILOGUE=0
done | tee $O/ab.log
