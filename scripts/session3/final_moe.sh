#!/usr/bin/env bash
# Session 3, last device call (carry .whl): decode attention v2 diagnosis and epilogue A/B on the 8B
# file, then the new host-expert paths (tests, issue 6's table) and a MoE decode profile.
set -u
source scripts/device_setup.sh 2>/dev/null
L="python3 -m lite.cli.main"; O=${OUT:-/tmp/out}; mkdir -p "$O"
log() { echo "== $(date +%T) $*" | tee -a "$O/final_moe.log"; }
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null
log attn diag; timeout 90 python3 scripts/session3/attn_diag.py 2>&1 | tail -20 | tee "$O/attn_diag.txt"
log attn bench; timeout 60 python3 scripts/bench_decode_attn.py --variant v1,v2 2>&1 | tail -30 | tee "$O/attn_v2.txt"
for epi in 1 0; do
  log "e2e v2 epilogue=$epi"; LITE_DECODE_ATTN=v2 LITE_MATVEC_EPILOGUE=$epi timeout 60 $L bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | tail -2 | tee -a "$O/e2e_epi.txt"
done
log expert tests; timeout 150 python3 -m pytest -q tests/test_expert_devcache.py tests/test_expert_residency.py tests/test_experts.py 2>&1 | tail -8 | tee -a "$O/final_moe.log"
f=/tmp/qwen3moe-30b-a3b-Q4_K.gguf
[ -f $f ] || $L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K $f >/dev/null
log table; CHUNK=8192 REPS=2 NGEN=64 PROMPTS=2048,8192,32768 OUT=$O/table timeout 330 bash scripts/moe_bench.sh Q4_K 2>&1 | tail -12 | tee -a "$O/final_moe.log"
log moe profile; timeout 60 python3 scripts/profile_decode.py $f 2048 2>&1 | tail -16 | tee "$O/profile_moe.txt"
log done
