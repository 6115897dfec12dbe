#!/usr/bin/env bash
# (session 9: TIQ3_XXSQV<0, 3>, the signed 16 KB table, was deleted after this call: it lost)
# Session 9, call 9 (carry .whl): IQ3_XXS's mvq with one 16 KB shared table of signed grid words
# (TIQ3_XXSQV<0, 3> / TIQ3_XXSG<0, 3>, LITE_IQ3_Q8=0,3: 437 SASS instructions in the 4-row loop
# against 556 for the default <1, 2>): GPU tests, the sweep, and decode A/B on the IQ3_XXS files.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
for a in "llama 8b IQ3_XXS 8i" "qwen3moe 30b-a3b IQ3_XXS 30i"; do
  set -- $a; ( $L synth --arch $1 --preset $2 --quant $3 /tmp/$4.gguf >/dev/null 2>&1 ) &
done
LITE_IQ3_Q8=0,3 timeout 150 python3 -m pytest -q tests/test_matvec_q8_emulated.py tests/test_kernels_iq.py \
    tests/test_experts_mvw.py -k "gpu or regroup or IQ3 or iq3" > $O/tests.log 2>&1
grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -8
timeout 150 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS \
    --variants mvq40g12,mvq40g03,mvq80g03,mvqp4g03,mvq41g03,mvq20g03,mvq40t12,mvq40t03,mvqp4t03 \
    --shapes 4096x14336,14336x4096,4096x4096 > $O/sweep.log 2>&1
grep -E "^IQ3|MISMATCH|mismatches" $O/sweep.log
wait
b() {  # label depth file env...
  local lab=$1 d=$2 f=$3; shift 3
  printf "%-16s " "$lab"; env "$@" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128" | awk -F'|' '{printf "%s ", $(NF-1)} END {print ""}'
}
for rep in 1 2; do
  b "8i 1,2" 512 /tmp/8i.gguf LITE_IQ3_Q8=1,2
  b "8i 0,3" 512 /tmp/8i.gguf LITE_IQ3_Q8=0,3
  b "30i 1,2" 2048 /tmp/30i.gguf LITE_IQ3_Q8=1,2
  b "30i 0,3" 2048 /tmp/30i.gguf LITE_IQ3_Q8=0,3
done | tee $O/ab.log
