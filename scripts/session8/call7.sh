#!/usr/bin/env bash
# (session 8, call 7: TIQ3_XXSQV<GC, 3>, the PRMT sign masks, was deleted after this call: even)
# Session 8, call 7 (carry .whl): IQ3_XXS's sign masks through PRMT's sign mode (TIQ3_XXSQV<GC, 3>:
# 562 SASS instructions in the 4-row loop against 610 for <1, 2>), with prefetch, against the
# default <1, 2>; its GPU test; 8B and 30B-A3B IQ3_XXS decode A/B.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
for a in "llama 8b IQ3_XXS 8i" "qwen3moe 30b-a3b IQ3_XXS 30i"; do
  set -- $a; ( $L synth --arch $1 --preset $2 --quant $3 /tmp/$4.gguf >/dev/null 2>&1 ) &
done
V=mvq40t12,mvq40t13,mvq40t03,mvq41t13,mvq41t12,mvq80t13,mvqp4t13,mvq20t13
timeout 90 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants $V \
    --shapes 4096x14336,14336x4096,4096x4096 > $O/iq3.log 2>&1
grep -E "^IQ3|MISMATCH|mismatches" $O/iq3.log
LITE_IQ3_Q8=1,3 timeout 60 python3 -m pytest -q tests/test_matvec_q8_emulated.py -k "gpu_iq3" 2>&1 | tail -1
wait
b() {  # label depth file env...
  local lab=$1 d=$2 f=$3; shift 3
  printf "%-16s " "$lab"; env "$@" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2; do
  b "8i t12" 512 /tmp/8i.gguf LITE_IQ3_Q8=1,2
  b "8i t13" 512 /tmp/8i.gguf LITE_IQ3_Q8=1,3
  b "30i t12" 2048 /tmp/30i.gguf LITE_IQ3_Q8=1,2
  b "30i t13" 2048 /tmp/30i.gguf LITE_IQ3_Q8=1,3
done | tee $O/ab.log
