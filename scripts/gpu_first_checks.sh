#!/usr/bin/env bash
# What the next GPU session should run first (on the device, after `source scripts/device_setup.sh`,
# carry .whl): code written after session 3's last device runs, most likely broken first, then the
# measurements still missing. Results in ${OUT:-/tmp/lite-checks}. Step 6 needs 2 GPUs (skips).
# For the llama.cpp peer: scripts/session3/moe.sh and dense.sh show how (llama-bench in .llb/,
# carried alone in a call before).
set -u
out=${OUT:-/tmp/lite-checks}; mkdir -p "$out"
L="python3 -m lite.cli.main"
t() { echo "\$ $*" | tee -a "$out/checks.log"; "$@" 2>&1 | tail -${TAIL:-6} | tee -a "$out/checks.log"; }
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
# 1. written after the last device call of session 3 (opt-in, never run on a GPU): the decode step's
#    graph I/O (LITE_GRAPH_IO=1), the qwen3 q/k norms folded into RoPE + KV store
#    (LITE_FOLD_QK_NORM=1); their tests, then A/B (docs/switches.md lists every switch)
#    and the rms_norm folded into the products (LITE_FOLD_NORM=1)
t python3 -m pytest -q tests/test_cuda_decode.py tests/test_cuda_backend.py tests/test_decode_io.py
for v in 0 1; do TAIL=6 t env LITE_GRAPH_IO=$v python3 scripts/profile_decode.py /tmp/8b.gguf 512; done
for v in 0 1; do TAIL=3 t env LITE_FOLD_NORM=$v $L bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda; done
TAIL=14 t env LITE_FOLD_NORM=1 LITE_GRAPH_IO=1 python3 scripts/profile_decode.py /tmp/8b.gguf 512
[ -f /tmp/q3-8b.gguf ] || $L synth --arch qwen3 --preset 8b --quant Q4_K /tmp/q3-8b.gguf >/dev/null 2>&1
[ -f /tmp/30b.gguf ] || $L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1
for m in /tmp/q3-8b.gguf /tmp/30b.gguf; do for f in 0 1; do
  TAIL=3 t env LITE_FOLD_QK_NORM=$f $L bench $m -p 512 -n 128 -r 3 --device cuda; done; done
# if both pass and gain: make them the default (lite/backends/cuda_decode.py fold_qk_norm,
# lite/backends/cuda_graph_io.py / cuda.py graph_io, lite/backends/cuda_norm.py)
# 2. decode attention v2 at head dims other than 64/128 (Gemma 3's 256 keeps v1 until this passes):
#    real models (scripts/carry_model.sh) with LITE_DECODE_ATTN=v2 forced, then raise
#    kernels/cupy_decode.py's V2_DEFAULT_MAX_D
t env LITE_DECODE_ATTN=v2 python3 -m pytest -q tests/test_cuda_backend.py -k "real or gemma or smollm"
# 3. issue 6's IQ3_XXS table and its peer (one call: synth + llama-bench + 4 lite configurations)
# TAIL=60 t bash scripts/session3/moe.sh IQ3_XXS    # needs /tmp/llb/llama-bench (a call before)
# 4. MoE decode profile with attention v2 (where the remaining ~1.8 ms of expert work goes)
TAIL=12 t python3 scripts/profile_decode.py /tmp/30b.gguf 2048
# 4b. the register matvec at the decode step's own shapes and other CTA shapes (CONFIG was tuned
#     on 4096x14336 / 14336x4096 only; q/k/v 6144x4096 runs at ~1.5 TB/s, o 4096x4096 ~1.4 TB/s)
TAIL=30 t python3 tests/gpu_sweep_matvec.py --types Q4_K,Q6_K --variants mv20,mv40,mv41,mv160 --shapes 6144x4096,28672x4096,4096x4096,4096x14336,128256x4096
# 5. grouped IQ3_XXS / IQ4_XS MoE decode at full size (moe_mv / moe_mvw, only tiny shapes ran)
t python3 -m pytest -q tests/test_experts_iq.py tests/test_experts_mvw.py
# 6. two GPUs (nvidia-h200-x2): the stage's KV cache / experts on its own GPU (fixed in session 2,
#    never re-run), the p2p hand-off and --handoff-stream (never run on a GPU)
t python3 -m pytest -q tests/test_multi_gpu.py
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] && TAIL=40 t bash scripts/multi_gpu.sh
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] && for h in "host" "p2p" "p2p --handoff-stream"; do TAIL=8 t $L bench /tmp/8b.gguf -r 2 --device cuda -p 32768 -n 32 --prefill 2048 --devices 0,1 --handoff $h; done
