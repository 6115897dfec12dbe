#!/usr/bin/env bash
# Session 9, call 11 (carry .whl): where the 8B IQ3_XXS decode step's time goes with session 9's
# defaults (regrouped IQ3_XXS): each kernel's GPU time inside the replayed graph (ncu, one step),
# beside the 8B Q4_K step; for the next session's choice of what to speed up.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"
O=${OUT:-/tmp}
for a in "llama 8b IQ3_XXS 8i" "llama 8b Q4_K 8b"; do
  set -- $a; ( $L synth --arch $1 --preset $2 --quant $3 /tmp/$4.gguf >/dev/null 2>&1 ) &
done
wait
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for f in 8i 8b; do
  timeout 200 $NCU --profile-from-start off --graph-profiling node --clock-control none \
      --cache-control none --metrics gpu__time_duration.sum --csv python3 scripts/trace_decode.py /tmp/$f.gguf 512 1 \
      > $O/k_$f.csv 2>/dev/null
  echo "== $f"; python3 scripts/trace_decode.py --summary $O/k_$f.csv 1 | head -14
done
