#!/usr/bin/env bash
# Session 4, device call 4 (carry .whl, right after call 3 on the same machine: the IQ3_XXS file is in
# /tmp): issue 6's table for the 30B-A3B IQ3_XXS file (scripts/moe_bench.sh). Results under $OUT.
set -u
source scripts/device_setup.sh 2>/dev/null
O=${OUT:-/tmp/out}; mkdir -p "$O"
python3 -m pytest -q tests/test_experts_iq.py tests/test_experts_mvw.py 2>&1 | tail -3 | tee -a "$O/call4.log"
CHUNK=8192 REPS=2 NGEN=64 OUT=$O/table bash scripts/moe_bench.sh IQ3_XXS 2>&1 | tail -14 | tee -a "$O/call4.log"
