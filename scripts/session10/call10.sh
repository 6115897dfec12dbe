#!/usr/bin/env bash
# Session 10, call 10 (carry .whl): IQ3_XXS_G4's dequantize with the sign bits gathered by one multiply
# (call 9: 76-78% of copy with an 8-step loop), its GPU test and kernel table rows; then lite's
# decode on the 8B and 30B-A3B IQ3_XXS files again, which call 11 runs llama.cpp on (same machine).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
for a in "llama 8b IQ3_XXS 8i" "qwen3moe 30b-a3b IQ3_XXS 30i"; do
  set -- $a; ( $L synth --arch $1 --preset $2 --quant $3 /tmp/$4.gguf >/dev/null 2>&1 ) &
done
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_iq.py tests/test_iq3xxs_gather_emulated.py > $O/tests.log 2>&1
echo "tests rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -4
timeout 60 python3 -m lite.kernels.bench --no-numba IQ3_XXS_G4 > $O/kbench.log 2>&1
grep -E "copy-vec16|IQ3" $O/kbench.log
wait
b() {  # label depth file
  printf "%-6s " "$1"; $L bench $3 -p $2 -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128" | awk -F'|' '{printf "%s ", $(NF-1)} END {print ""}'
}
for rep in 1 2 3; do b 8i 512 /tmp/8i.gguf; b 30i 2048 /tmp/30i.gguf; done | tee $O/lite.log
