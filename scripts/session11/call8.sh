# Session 11, call 8: what bounds mvt's compute alone (D=1: no copies) over G4 (TIQ3_XXSG, 781 SASS
# instructions in the 8-row loop) and over repack12 (TIQ3_XXSW, 535, yet slower: calls 5, 7): stall
# reasons per issue, shared-memory wavefronts and bank conflicts, LSU/MIO throughput (Nsight Compute).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp/out}; mkdir -p "$O"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M=smsp__inst_executed.sum,sm__cycles_elapsed.avg,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
for r in short_scoreboard mio_throttle long_scoreboard wait math_pipe_throttle not_selected lg_throttle barrier dispatch_stall no_instruction selected branch_resolving; do
  M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
M=$M,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
M=$M,l1tex__throughput.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts.sum,smsp__inst_executed_op_shared_ld.sum
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --shapes 4096x14336"
for v in mvqw8x4g1d1 mvqv8x4d1 mvqw8x4g1; do
  timeout 120 "$NCU" --clock-control none -k regex:mvt --launch-skip 3 --launch-count 1 --metrics $M $S --variants $v > "$O/ncu_$v.txt" 2>&1
  echo "== $v"; grep -E "^ +[a-z_]+__" "$O/ncu_$v.txt" | awk '{print $1, $(NF)}'
done
