#!/usr/bin/env bash
# Session 10, call 4 (warm or carry .whl): Nsight Compute at the GPU's own clocks (--clock-control
# none; session 9's call 4 ran at ncu's locked 1.45 GHz) on mv_iq2 over the signed layout, without
# and with prefetch, and the grouped layout, at 4096x14336: calls 2-3 found neither fewer
# instructions (signed layout, -22%) nor conflict-free grid lookups (32 copies) faster alone.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp/out}; mkdir -p "$O"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 400 "$NCU" --clock-control none -k regex:mv_iq2 --launch-count 6 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats \
    --metrics smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__average_warp_latency_issue_stalled_not_selected.ratio,smsp__average_warp_latency_issue_stalled_selected.ratio,smsp__average_warp_latency_issue_stalled_dispatch_stall.ratio,smsp__average_warp_latency_issue_stalled_no_instruction.ratio,smsp__average_warp_latency_issue_stalled_membar.ratio,smsp__average_warp_latency_issue_stalled_drain.ratio,smsp__average_warp_latency_issue_stalled_sleeping.ratio,smsp__average_warp_latency_issue_stalled_misc.ratio,smsp__average_warp_latency_issue_stalled_branch_resolving.ratio,smsp__average_warp_latency_issue_stalled_tex_throttle.ratio,smsp__average_warp_latency_issue_stalled_imc_miss.ratio \
    python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvq40s12,mvq41s12,mvq40g12 --shapes 4096x14336 \
    > "$O/ncu.txt" 2>&1
grep -E "^  mv_iq2|SM Frequency|DRAM Throughput|Duration|L1/TEX Cache Throughput|Issue Slots Busy|Achieved Occupancy|Warp Cycles Per Issued|No Eligible|Eligible Warps|Active Warps Per|stalled|ERR_" "$O/ncu.txt" | sed 's/  */ /g' | head -150
