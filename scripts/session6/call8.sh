#!/usr/bin/env bash
# Session 6, call 8 (carry .whl): the expert-residency GPU tests after this session's moe_mvw changes
# (gated (16,2,4), IQ3 grid through L1): GPU = host experts byte for byte, any cache size; then host
# experts' decode with 25% / 50% caches on the 30B-A3B files (session 4's table: IQ3_XXS 159.3 /
# 163.7 tg32).
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
( $L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS /tmp/30i.gguf >/dev/null 2>&1
  $L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1 ) &
SYN=$!
timeout 220 python3 -m pytest -q tests/test_experts.py tests/test_expert_residency.py tests/test_expert_devcache.py > $O/experts_tests.log 2>&1
tail -3 $O/experts_tests.log; grep -E "^FAILED" $O/experts_tests.log | head
wait $SYN
for f in 30i 30b; do
  for c in 25% 50%; do
    echo "== $f --experts host --expert-cache $c"
    timeout 90 $L bench /tmp/$f.gguf -p 2048 -n 32 -r 2 --device cuda --experts host --expert-cache $c 2>&1 | grep -E "pp2048|tg32|rror" | tail -2
  done
done
