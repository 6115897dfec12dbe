#!/usr/bin/env bash
# Session 9, call 4 (warm or carry .whl): Nsight Compute on IQ3_XXS's mvq product, raw blocks
# (TIQ3_XXSQV<1, 2>, the default) against the grouped layout (TIQ3_XXSG<1, 2>, call 3: 15.0 against
# 16.5 us with the quantizer at 4096x14336): what binds once the 16-bit block loads are gone.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp/out}; mkdir -p "$O"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 400 "$NCU" -k regex:mv_iq2 --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats \
    python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvq40t12,mvq40g12 --shapes 4096x14336 \
    > "$O/ncu_g.txt" 2>&1
grep -E "^  [a-z_]+<|mv_iq2|Memory Throughput|DRAM Throughput|L1/TEX Hit|Achieved Occupancy|Stall|Warp Cycles Per Issued|Issue Slots|Issued Warp|No Eligible|Eligible Warps|Bank|Wavefronts|Executed Ipc|ERR_|Duration|L1/TEX Cache Throughput|L2 Cache Throughput" \
    "$O/ncu_g.txt" | head -150
