#!/usr/bin/env bash
# Session 9, call 7 (carry .whl): the kernel table with IQ3_XXS_G4, and lite's decode on the 8B and
# 30B-A3B IQ3_XXS and 8B Q4_K files with session 9's defaults; call 8 runs llama.cpp on the same files.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
for a in "llama 8b IQ3_XXS 8i" "qwen3moe 30b-a3b IQ3_XXS 30i" "llama 8b Q4_K 8b"; do
  set -- $a; ( $L synth --arch $1 --preset $2 --quant $3 /tmp/$4.gguf >/dev/null 2>&1 ) &
done
timeout 120 python3 -m lite.kernels.bench --no-numba Q4_K Q6_K Q8_0 IQ3_XXS IQ3_XXS_G4 > $O/kbench.log 2>&1
grep -E "copy|matvec|dequant" $O/kbench.log
wait
b() {  # label depth file env...
  local lab=$1 d=$2 f=$3; shift 3
  printf "%-16s " "$lab"; env "$@" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128" | awk -F'|' '{printf "%s ", $(NF-1)} END {print ""}'
}
for rep in 1 2 3; do
  b "8i" 512 /tmp/8i.gguf X=1
  b "30i" 2048 /tmp/30i.gguf X=1
  b "8b" 512 /tmp/8b.gguf X=1
done | tee $O/lite.log
