#!/usr/bin/env bash
# Session 10, call 9 (carry .whl): IQ3_XXS_G4 with its signs placed (the GPU backend's layout now:
# kernels/iq3_groups.py, 408 bytes a group): the GPU tests that read it, the kernel table's IQ3
# rows (counting the file's bytes), and lite's decode on the 8B and 30B-A3B IQ3_XXS files (call 10
# runs llama.cpp on the same files).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
for a in "llama 8b IQ3_XXS 8i" "qwen3moe 30b-a3b IQ3_XXS 30i"; do
  set -- $a; ( $L synth --arch $1 --preset $2 --quant $3 /tmp/$4.gguf >/dev/null 2>&1 ) &
done
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_iq.py tests/test_matvec_q8_emulated.py \
    tests/test_iq3xxs_gather_emulated.py tests/test_kernels_dequant.py tests/test_cli.py \
    "tests/test_cuda_backend.py::test_regrouped_iq3xxs_weights_match_cpu_and_the_file_layout" \
    tests/test_cuda_backend.py -k "IQ3 or iq3 or regroup or bench" > $O/tests.log 2>&1
echo "tests rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -8
timeout 90 python3 -m lite.kernels.bench --no-numba IQ3_XXS IQ3_XXS_G4 Q4_K > $O/kbench.log 2>&1
grep -E "copy|matvec|dequant" $O/kbench.log | grep -E "copy-vec16|4096x14336|14336x4096|4096x4096"
wait
b() {  # label depth file
  printf "%-6s " "$1"; $L bench $3 -p $2 -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128" | awk -F'|' '{printf "%s ", $(NF-1)} END {print ""}'
}
for rep in 1 2 3; do b 8i 512 /tmp/8i.gguf; done | tee $O/lite.log
b 30i 2048 /tmp/30i.gguf | tee -a $O/lite.log
