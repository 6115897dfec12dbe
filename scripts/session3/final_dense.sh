#!/usr/bin/env bash
# Session 3, late device call (carry .whl): the work of this session on the 8B shape. GPU tests of
# the epilogue kernels and decode attention v2, their kernel timings, IQ3_XXS v2 matvec sweep, then
# lite bench end to end per variant, and the per-op profile of the best. Results under $OUT.
set -u
source scripts/device_setup.sh 2>/dev/null
L="python3 -m lite.cli.main"; O=${OUT:-/tmp/out}; mkdir -p "$O"
log() { echo "== $(date +%T) $*" | tee -a "$O/final.log"; }
[ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null
log tests; timeout 200 python3 -m pytest -q tests/test_cuda_backend.py tests/test_cuda_decode.py 2>&1 | tail -6 | tee -a "$O/final.log"
log attn; timeout 120 python3 scripts/bench_decode_attn.py --variant v1,v2 --v2-tune "" "warps=4,blocks_per_sm=4" "warps=4,warp_bytes=16384,blocks_per_sm=3" "min_chunk=128" 2>&1 | tail -40 | tee "$O/attn_v2.txt"
log iq3 sweep; timeout 120 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvp8,v280,v281,v240,v241,v2p8,v2p4 2>&1 | tail -14 | tee "$O/sweep_iq3.txt"
for v in "v1" "v2"; do
  log "e2e attn $v"; LITE_DECODE_ATTN=$v timeout 150 $L bench /tmp/8b.gguf -p 512,8192,32768 -n 128 -r 3 --device cuda --prefill auto 2>&1 | tail -7 | tee "$O/e2e_$v.txt"
done
log "e2e no epilogue"; LITE_MATVEC_EPILOGUE=0 timeout 60 $L bench /tmp/8b.gguf -p 512 -n 128 -r 3 --device cuda 2>&1 | tail -3 | tee "$O/e2e_noepi.txt"
best=$(python3 - "$O" <<'PY'
import re, sys
t = {}
for v in ("v1", "v2"):
    m = re.search(r"tg128 @ 512 \|\s*([\d.]+)", open(f"{sys.argv[1]}/e2e_{v}.txt").read() or "")
    t[v] = float(m.group(1)) if m else 0
print(max(t, key=t.get))
PY
)
log "profile ($best)"; LITE_DECODE_ATTN=$best timeout 90 python3 scripts/profile_decode.py /tmp/8b.gguf 512 2>&1 | tail -16 | tee "$O/profile_$best.txt"
log done
