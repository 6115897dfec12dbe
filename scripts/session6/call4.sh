#!/usr/bin/env bash
# Session 6, call 4 (carry .whl; /tmp/llb/llama-bench copied by call 3): why the epilogue test's
# Q8_0 case failed in call 2 (graph capture invalidated), the rest of the GPU tests, IQ3_XXS MoE
# decode A/Bs of the best call-2 shapes with the grid read through L1 (LITE_IQ3_GCOPIES=0), and
# llama.cpp on the same IQ3_XXS file in this session.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS /tmp/30i.gguf >/dev/null 2>&1 ) &
SYN=$!
K="test_matvec_epilogues_equal_the_separate_launches and Q8_0"
for pdl in auto 0; do
  echo "== epilogue Q8_0, LITE_PDL=$pdl"
  LITE_PDL=$pdl timeout 60 python3 -m pytest -q -x tests/test_cuda_backend.py -k "$K" > $O/epi_pdl$pdl.log 2>&1
  grep -E "passed|failed|Error|error" $O/epi_pdl$pdl.log | grep -v "^E  *$" | head -8
done
echo "== the rest"
timeout 200 python3 -m pytest -q tests/test_cuda_backend.py tests/test_experts_mvw.py \
    --deselect "tests/test_cuda_backend.py::test_matvec_epilogues_equal_the_separate_launches[llama-Q8_0]" \
    > $O/rest.log 2>&1; tail -4 $O/rest.log
wait $SYN
b() {  # label env... file
  local f=${@: -1}; local envs=("${@:2:$#-2}")
  printf "%-44s " "$1"; env "${envs[@]}" $L bench $f -p 2048 -n 128 -r 3 --device cuda 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}'
}
for rep in 1 2; do
  b "iq3 default" LITE_PDL=auto /tmp/30i.gguf
  b "iq3 2048=16,2,4 gc0" LITE_MOE_MVW="2048=16,2,4" LITE_IQ3_GCOPIES=0 /tmp/30i.gguf
  b "iq3 2048=16,1,4 gc0" LITE_MOE_MVW="2048=16,1,4" LITE_IQ3_GCOPIES=0 /tmp/30i.gguf
  b "iq3 2048=16,2,4 gc1" LITE_MOE_MVW="2048=16,2,4" LITE_IQ3_GCOPIES=1 /tmp/30i.gguf
done
b "iq3 2048=16,2,4 gc0" LITE_MOE_MVW="2048=16,2,4" LITE_IQ3_GCOPIES=0 /tmp/30i.gguf
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
for d in 0 2048; do
  echo "llama.cpp 30i d$d"
  timeout 100 /tmp/llb/llama-bench -m /tmp/30i.gguf -p 0 -n 128 -d $d -fa 1 -ngl 99 -r 3 -o md 2>&1 | grep -E "^\||error|invalid" | tail -1
done
b "iq3 2048=16,2,4 gc0" LITE_MOE_MVW="2048=16,2,4" LITE_IQ3_GCOPIES=0 /tmp/30i.gguf
