#!/usr/bin/env bash
# Session 3, MoE device call (carry .whl; /tmp/llb/llama-bench copied by the call before):
# llama.cpp peer and lite on the synthetic 30B-A3B file of one quant: all experts on the GPU and in
# host RAM; moe_mv vs moe_mvw decode; issue 6's table. Usage: bash scripts/session3/moe.sh Q4_K|IQ3_XXS [ctx]
set -u
q=$1
source scripts/device_setup.sh
L="python3 -m lite.cli.main"; O=${OUT:-/tmp/out}; mkdir -p "$O"
log() { echo "== $(date +%T) $*" | tee -a "$O/moe.log"; }
f=/tmp/qwen3moe-30b-a3b-$q.gguf
log synth $q; ( time $L synth --arch qwen3moe --preset 30b-a3b --quant $q $f ) 2>&1 | tail -3 | tee -a "$O/moe.log"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
log peer gpu; timeout 150 /tmp/llb/llama-bench -m $f -p 2048,8192,32768 -n 128 -fa 1 -ngl 99 -ub 2048 -r 3 -o md 2>&1 | tee "$O/peer_moe_$q.md" | grep -E "^\|" | tail -4
log peer host; timeout 120 /tmp/llb/llama-bench -m $f -p 8192 -n 32 -fa 1 -ngl 99 -ncmoe 48 -ub 8192 -r 2 -o md 2>&1 | tee "$O/peer_moe_host_$q.md" | grep -E "^\|" | tail -2
log decode A/B; PROMPTS=2048 NGEN=64 REPS=3 OUT=$O/ab timeout 150 bash scripts/moe_decode_ab.sh $q 2>&1 | tail -12 | tee -a "$O/moe.log"
log table; CHUNK=8192 REPS=2 NGEN=64 OUT=$O/table bash scripts/moe_bench.sh $q 2>&1 | tail -14 | tee -a "$O/moe.log"
if [ "${2:-}" = ctx ]; then
  log ctx 131072; $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null
  timeout 150 $L bench /tmp/8b.gguf -p 130048 -n 32 -r 1 -c 131072 --device cuda --prefill auto 2>&1 | tail -4 | tee -a "$O/moe.log"
fi
log done
