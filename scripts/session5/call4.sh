#!/usr/bin/env bash
# Session 5, call 4: each kernel's GPU time inside one replayed decode step (ncu, boost clocks):
# 30B-A3B Q4_K with LITE_MOE_FOLD 0 and 1, and the 8B Q4_K; the replay times come from
# profile_decode (session 4 / this session).
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=$OUT
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
$L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
$L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1
run() {  # tag env model n
  local tag=$1 envs=$2 f=$3 n=$4
  env $envs timeout 200 $NCU --profile-from-start off --graph-profiling node --clock-control none \
      --metrics gpu__time_duration.sum --csv python3 scripts/trace_decode.py /tmp/$f.gguf $n 1 > $O/k_$tag.csv 2> $O/k_$tag.err
  echo "== $tag ($envs)"; python3 scripts/trace_decode.py --summary $O/k_$tag.csv 1 2>&1 | head -24
  env $envs python3 scripts/profile_decode.py /tmp/$f.gguf $n 2>&1 | head -1
}
run 30b "LITE_MOE_FOLD=0" 30b 2048
run 30bfold "LITE_MOE_FOLD=1" 30b 2048
run 8b "LITE_MOE_FOLD=0" 8b 512
echo "== LITE_PDL=3"; LITE_PDL=3 python3 scripts/profile_decode.py /tmp/30b.gguf 2048 2>&1 | head -1
