#!/usr/bin/env bash
# Session 10, call 8 (warm or carry .whl): where mv_iq2 over the signed layout stalls, per SASS
# instruction (Nsight Compute's source page, warp stall samples), at 4096x14336: call 7 found a plain
# read of its 22.5 MB takes 6.8 us (84% of copy-vec16) against the product's 13.7.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp/out}; mkdir -p "$O"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 300 "$NCU" --clock-control none -k regex:mv_iq2 --launch-skip 1 --launch-count 1 --section SourceCounters \
    --section WarpStateStats --page source --print-source sass --csv \
    python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvq40s12 --shapes 4096x14336 > "$O/src.csv" 2> "$O/ncu.err"
echo "rc $?"; wc -l "$O/src.csv"; head -3 "$O/src.csv" | cut -c1-600; tail -3 "$O/ncu.err"
