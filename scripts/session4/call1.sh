#!/usr/bin/env bash
# Session 4, first device call: steps 1, 4 and 4b of scripts/gpu_first_checks.sh (the opt-ins written
# after session 3's last device call: their GPU tests and A/B), then what profilers the image has.
source scripts/device_setup.sh 2>/dev/null
export OUT=${OUT:-/tmp/out}
L="python3 -m lite.cli.main"
out=$OUT; log=$out/checks.log
t() { echo "\$ $*" | tee -a "$log"; "$@" 2>&1 | tail -${TAIL:-6} | tee -a "$log"; }
which ncu nsys 2>&1 | tee -a $log; ls /usr/local/cuda/bin 2>/dev/null | tr '\n' ' ' | tee -a $log; echo | tee -a $log
$L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
TAIL=15 t python3 -m pytest -q -x tests/test_cuda_decode.py tests/test_cuda_backend.py tests/test_decode_io.py tests/test_fold_norm.py tests/test_fold_residuals.py
for v in 0 1; do TAIL=6 t env LITE_GRAPH_IO=$v python3 scripts/profile_decode.py /tmp/8b.gguf 512; done
for f in 0 1; do for g in 0 1; do TAIL=3 t env LITE_FOLD_NORM=$f LITE_GRAPH_IO=$g $L bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda; done; done
TAIL=16 t env LITE_FOLD_NORM=1 LITE_GRAPH_IO=1 python3 scripts/profile_decode.py /tmp/8b.gguf 512
$L synth --arch qwen3 --preset 8b --quant Q4_K /tmp/q3-8b.gguf >/dev/null 2>&1
$L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1
for m in /tmp/q3-8b.gguf /tmp/30b.gguf; do for f in 0 1; do
  TAIL=3 t env LITE_FOLD_QK_NORM=$f $L bench $m -p 512 -n 128 -r 3 --device cuda; done; done
TAIL=16 t python3 scripts/profile_decode.py /tmp/30b.gguf 2048
TAIL=30 t python3 tests/gpu_sweep_matvec.py --types Q4_K,Q6_K --variants mv20,mv40,mv41,mv160 --shapes 6144x4096,28672x4096,4096x4096,4096x14336,128256x4096
echo DONE | tee -a $log
