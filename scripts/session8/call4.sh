#!/usr/bin/env bash
# Session 8, call 4 (after the wheels went into /tmp/site and the Gemma 3 pieces into /tmp/m, back to
# back: scripts/carry_model.sh): the real Gemma 3 270M Q4_K_M file on the GPU with mvq (its Q4_K
# and Q6_K products now take it) in both record layouts; decode A/B of the layouts on the 8B Q4_K and
# IQ3_XXS files (call 3 found layout 0 ahead on the 8B by ~2%, within the spread); the kernel table.
set -u
source scripts/device_setup.sh
bash scripts/carry_model.sh --join
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
for a in "llama 8b Q4_K 8b" "llama 8b IQ3_XXS 8i"; do
  set -- $a; [ -f /tmp/$4.gguf ] || ( $L synth --arch $1 --preset $2 --quant $3 /tmp/$4.gguf >/dev/null 2>&1 ) &
done
for lay in 1 0; do
  LITE_Q8_LAYOUT=$lay timeout 120 python3 -m pytest -q -rs tests/test_cuda_backend.py -k "real" 2>&1 | tail -3 | sed "s/^/L$lay /"
done | tee $O/real.log
wait
b() {  # label depth file env...
  local lab=$1 d=$2 f=$3; shift 3
  printf "%-16s " "$lab"; env "$@" $L bench $f -p $d -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2 3; do
  b "8b layout1" 512 /tmp/8b.gguf LITE_Q8_LAYOUT=1
  b "8b layout0" 512 /tmp/8b.gguf LITE_Q8_LAYOUT=0
  [ $rep = 3 ] && continue
  b "8i layout1" 512 /tmp/8i.gguf LITE_Q8_LAYOUT=1
  b "8i layout0" 512 /tmp/8i.gguf LITE_Q8_LAYOUT=0
done | tee $O/ab.log
timeout 60 python3 -m lite.kernels.bench --no-numba Q4_K Q6_K Q8_0 IQ3_XXS > $O/kbench.log 2>&1
cat $O/kbench.log | tail -40
