#!/usr/bin/env bash
# Session 9, call 5 (carry .whl): IQ3_XXS regrouped at load time (kernels/iq3_groups.py, the GPU
# backend's LITE_IQ3_REGROUP, default on): the GPU tests, the kernel table with IQ3_XXS_G4 beside
# IQ3_XXS, and the decode / prefill A/B on the 8B and 30B-A3B IQ3_XXS files (regroup on / off).
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
for a in "llama 8b IQ3_XXS 8i" "qwen3moe 30b-a3b IQ3_XXS 30i"; do
  set -- $a; ( $L synth --arch $1 --preset $2 --quant $3 /tmp/$4.gguf >/dev/null 2>&1 ) &
done
timeout 240 python3 -m pytest -q tests/test_kernels_iq.py tests/test_matvec_q8_emulated.py tests/test_experts_iq.py \
    tests/test_cuda_backend.py -k "regroup or IQ3 or iq3 or gpu_matches_cpu or real" > $O/tests.log 2>&1
grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -12
timeout 90 python3 -m lite.kernels.bench --no-numba IQ3_XXS IQ3_XXS_G4 > $O/kbench.log 2>&1
grep -E "copy|matvec|dequant" $O/kbench.log
wait
b() {  # label depth file env...
  local lab=$1 d=$2 f=$3; shift 3
  printf "%-16s " "$lab"; env "$@" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep -E "pp|tg" | awk -F'|' '{printf "%s ", $(NF-1)} END {print ""}'
}
for rep in 1 2 3; do
  b "8i regroup" 512 /tmp/8i.gguf LITE_IQ3_REGROUP=1
  b "8i file" 512 /tmp/8i.gguf LITE_IQ3_REGROUP=0
done | tee $O/ab.log
for rep in 1 2; do
  b "30i regroup" 2048 /tmp/30i.gguf LITE_IQ3_REGROUP=1
  b "30i file" 2048 /tmp/30i.gguf LITE_IQ3_REGROUP=0
done | tee -a $O/ab.log
