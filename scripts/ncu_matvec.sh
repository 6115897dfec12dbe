#!/usr/bin/env bash
# Nsight Compute on the decode matvec kernels (scripts/ncu_matvec.py): per kernel the DRAM
# throughput, achieved occupancy, and the warp stall reasons, to find what binds Q4_K and IQ3_XXS
# (issue 3). On the device after `source scripts/device_setup.sh`; results in $OUT/ncu_matvec.txt.
# If ncu says ERR_NVGPUCTRPERM, the machine does not let users read the counters: nothing to do.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
# 5 shapes x 4 launches: skip the first 2 of each (warm-up) by profiling every launch and reading
# the later ones; ncu serializes launches, so this takes a minute or two.
timeout 500 "$NCU" --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section InstructionStats --launch-count 20 \
    python3 scripts/ncu_matvec.py "$@" > "$O/ncu_matvec.txt" 2>&1
grep -E "^  [a-z_]+<|mv|qx|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issue Slots|Bank|Wavefronts|ERR_" \
    "$O/ncu_matvec.txt" | head -120
