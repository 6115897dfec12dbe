#!/usr/bin/env bash
# What the next GPU session should run first (on the device, after `source scripts/device_setup.sh`):
# code written after session 2's last device runs, in the order of what is most likely broken.
# Results in ${OUT:-/tmp/lite-checks}. Needs a 2-GPU machine for step 1 (skips it otherwise).
set -u
out=${OUT:-/tmp/lite-checks}; mkdir -p "$out"
L="python3 -m lite.cli.main"
t() { echo "\$ $*" | tee -a "$out/checks.log"; "$@" 2>&1 | tail -${TAIL:-6} | tee -a "$out/checks.log"; }
# 1. the KV cache / experts now allocated on the stage's own GPU (lite/stage.py): identity and speed
t python3 -m pytest -q tests/test_multi_gpu.py
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] && TAIL=40 t bash scripts/multi_gpu.sh
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] && for h in "host" "p2p" "p2p --handoff-stream"; do TAIL=8 t $L bench /tmp/8b.gguf -r 2 --device cuda -p 32768 -n 32 --prefill 2048 --devices 0,1 --handoff $h; done   # p2p hand-off (never run on a GPU yet), identity in test_multi_gpu.py above
# 2. everything on one GPU (the decode helper's final version ran only part of this file)
t python3 -m pytest -q tests/test_cuda_backend.py tests/test_cuda_decode.py tests/test_flash_attn.py
# 3. MoE changes after the last MoE device call: batched cache copies, eviction by next use, prefetch
t python3 -m pytest -q tests/test_experts.py tests/test_expert_residency.py
t env LITE_EXPERT_PREFETCH=1 python3 -m pytest -q tests/test_expert_residency.py
# 4. issue 6's table (one quant per call: each configuration loads ~17 GB)
# TAIL=40 t bash scripts/moe_bench.sh Q4_K
# 5. decode: docs/wip/decode-attention-latency.patch (git apply, then tests/test_cuda_decode.py and
#    scripts/profile_decode.py /tmp/8b.gguf 512 and 8192)
# 6. issue 4's --max-context 131072 on the 8B shape (KV 17.2 GiB f16): decode at the far end too
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
TAIL=8 t $L bench /tmp/8b.gguf -p 131072 -n 32 -r 1 -c 131072 --device cuda --prefill auto
# 7. the half2 matvec variant for Q4_K/Q6_K (kernels/matvec_half.py, opt-in, never run on a GPU):
#    correctness, then its timing beside the register kernel
t python3 -m pytest -q tests/test_kernels_matvec_half.py
TAIL=30 t python3 tests/gpu_sweep_matvec.py --types Q4_K,Q6_K --variants mvh8,mvh4,mvh8c64,mvh4c64
# 8. grouped IQ3_XXS / IQ4_XS MoE decode (moe_mv, never run on a GPU)
t python3 -m pytest -q tests/test_experts_iq.py tests/test_moe_mv_emulated.py tests/test_expert_residency.py
# 9. MoE decode kernel variant moe_mvw (LITE_MOE_MV=warp, opt-in, never run on a GPU): tests, then A/B
# TAIL=20 t bash scripts/moe_decode_ab.sh Q4_K
