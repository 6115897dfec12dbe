#!/usr/bin/env bash
# Session 8, call 5 (carry .whl): the record layout by record size (Q6_K's 24-word records in layout
# 1, Q4_K's and IQ3_XXS's 20-word ones in 0: kernels/matvec_q8.py LAYOUTS): the GPU tests, the 8B
# decode against layout 0 for all, lite's figures on the files llama.cpp runs next (call 6), the
# kernel table.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
for a in "llama 8b Q4_K 8b" "llama 8b IQ3_XXS 8i" "qwen3moe 30b-a3b IQ3_XXS 30i" "qwen3moe 30b-a3b Q4_K 30b"; do
  set -- $a; ( $L synth --arch $1 --preset $2 --quant $3 /tmp/$4.gguf >/dev/null 2>&1 ) &
done
timeout 240 python3 -m pytest -q tests/test_matvec_q8_emulated.py tests/test_cuda_backend.py \
    tests/test_experts_mvw.py tests/test_kernels_matvec.py > $O/tests.log 2>&1
grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -12
wait
b() {  # label depth file env...
  local lab=$1 d=$2 f=$3; shift 3
  printf "%-16s " "$lab"; env "$@" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2 3; do
  b "8b default" 512 /tmp/8b.gguf X=1
  b "8b layout0" 512 /tmp/8b.gguf LITE_Q8_LAYOUT=0
done | tee $O/ab.log
{ b "8i default" 512 /tmp/8i.gguf X=1; b "30i default" 2048 /tmp/30i.gguf X=1; b "30b default" 2048 /tmp/30b.gguf X=1; } | tee -a $O/ab.log
timeout 60 python3 -m lite.kernels.bench --no-numba Q4_K Q6_K Q8_0 IQ3_XXS > $O/kbench.log 2>&1
grep -E "copy|matvec" $O/kbench.log
