#!/usr/bin/env bash
# Session 3, device call 3 (carry .whl, same warm machine: /tmp/8b.gguf from dense.sh):
# the GPU tests of HEAD, the MoE tests, --max-context 131072 on the 8B shape.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"; O=${OUT:-/tmp/out}; mkdir -p "$O"
log() { echo "== $(date +%T) $*" | tee -a "$O/checks.log"; }
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null
log ctx131072; timeout 150 $L bench /tmp/8b.gguf -p 131072 -n 32 -r 1 -c 131072 --device cuda --prefill auto 2>&1 | tail -5 | tee -a "$O/checks.log"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv | tee -a "$O/checks.log"
for t in tests/test_cuda_backend.py tests/test_cuda_decode.py tests/test_flash_attn.py tests/test_experts.py \
         tests/test_expert_residency.py tests/test_experts_iq.py tests/test_moe_mv_emulated.py tests/test_experts_mvw.py \
         tests/test_kernels_matvec.py tests/test_kernels_iq.py; do
  log $t; timeout 240 python3 -m pytest -q -x $t 2>&1 | tail -4 | tee -a "$O/checks.log"
done
log prefetch; LITE_EXPERT_PREFETCH=1 timeout 200 python3 -m pytest -q -x tests/test_expert_residency.py 2>&1 | tail -3 | tee -a "$O/checks.log"
log done
