#!/usr/bin/env bash
# Session 5, call 7: the GPU test files whole with the session's defaults (PDL on, gated MoE
# product, v2 attention to head dim 256, the combine a thread a column), and the 8B decode once.
set -u
source scripts/device_setup.sh
t() { echo "\$ $*"; timeout ${TO:-180} "$@" 2>&1 | tail -${TAIL:-4}; }
t python3 -m pytest -q -x tests/test_cuda_backend.py
TO=60 t python3 -m pytest -q -x tests/test_decode_io.py tests/test_multi_gpu.py
python3 -m lite.cli.main synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
for i in 1; do python3 -m lite.cli.main bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | tail -1; done
