# Session 11, call 3: Nsight Compute (issue activity, IPC, warps, clocks, stall reasons) on the compute
# alone (mvt D=1: no copies), mvt, mvm and mv_iq2 at 4096x14336, then the compute alone at 32 warps an SM.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp/out}; mkdir -p "$O"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
S="python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --shapes 4096x14336"
timeout 100 $S --variants mvqw4x8g1d1,mvqw4x8g1,mvqw8x4g1 2>&1 | grep -v "^  IQ3" | tr '|' '\n'
for v in "mvqw8x4g1d1 mvt" "mvqw8x4g1 mvt" "mvqm8x5712 mvm" "mvq40g12 mv_iq2"; do
  set -- $v
  timeout 120 "$NCU" --clock-control none -k regex:$2 --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy \
      --section InstructionStats --section MemoryWorkloadAnalysis \
      $S --variants $1 > "$O/ncu_$1.txt" 2>&1
  echo "== $1"; grep -E "Duration|SM Frequency|DRAM Throughput|Issue Slots Busy|Executed Ipc Active|Achieved Active Warps|Warp Cycles Per Issued|Issued Warp|Executed Instructions  |Stall|L1/TEX Hit|Mem Busy|Max Bandwidth|Theoretical Occ|Achieved Occ" "$O/ncu_$1.txt" | head -30
done
