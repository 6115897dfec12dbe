#!/usr/bin/env bash
# What the next GPU session should run first (on the device, after `source scripts/device_setup.sh`):
# the code written after the last device run of session 1 has never run on a GPU. One call, in the
# order of what is most likely to be broken; results in ${OUT:-/tmp/lite-checks}.
set -u
out=${OUT:-/tmp/lite-checks}; mkdir -p "$out"
L="python3 -m lite.cli.main"
t() { echo "\$ $*" | tee -a "$out/checks.log"; "$@" 2>&1 | tail -${TAIL:-6} | tee -a "$out/checks.log"; }
# 1. kernels (Q4_1/Q5_0/Q5_1 Numba matvec are new), then the engine against the CPU
t python3 -m pytest -q tests/test_kernels_matvec.py tests/test_kernels_dequant.py tests/test_kernels_iq.py
t python3 -m pytest -q tests/test_cuda_backend.py
# 2. the grouped MoE path and the expert cache (opt-in until this passes)
t python3 -m pytest -q tests/test_experts.py
t env LITE_MOE_GROUPED=1 python3 -m pytest -q tests/test_cuda_backend.py -k qwen3moe
# 3. calibration and the stage timeline with device times
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
TAIL=30 t $L calibrate /tmp/8b.gguf --device cuda --check 8192 --check-chunks 512,1024,2048
TAIL=20 t $L bench /tmp/8b.gguf -p 8192 -n 0 -r 2 --device cuda --prefill auto
TAIL=20 t $L bench /tmp/8b.gguf -p 8192 -n 0 -r 2 --device cuda --prefill 2048 --layer-split 4 --timeline "$out/tl.json"
# 4. one-pass prefill attention (kernels/flash_attn.py, opt-in): its tests ran in step 1; speed
TAIL=8 t env LITE_FLASH_ATTN=1 $L bench /tmp/8b.gguf -p 8192,32768 -n 0 -r 2 --device cuda --prefill 2048
# 5. where decode time goes (then try docs/wip/decode-attention-splits.patch against it)
TAIL=12 t python3 scripts/profile_decode.py /tmp/8b.gguf 512
