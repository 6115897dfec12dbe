# Session 12, call 7: Nsight Compute on mvi<16, 1, 1> at 4096x14336 (what binds it at 11.5 us).
source scripts/device_setup.sh >/dev/null 2>&1
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 200 $NCU --clock-control none -k regex:mvi --launch-count 1 --set full --page details \
   python3 scripts/session12/mvc_proto.py "mvi<16, 1, 1>" 4096x14336 > $OUT/ncu_mvi.txt 2>&1
grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Issue Slots Busy|Issued Ipc|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|L1/TEX Hit|L2 Hit|Mem Pipes|Shared|Warp Cycles Per Issued|Eligible Warps|No Eligible|Active Warps" $OUT/ncu_mvi.txt | head -60
timeout 200 $NCU --clock-control none -k regex:mvi --launch-count 1 --section SourceCounters --section WarpStateStats \
   --page source --print-source sass --csv python3 scripts/session12/mvc_proto.py "mvi<16, 1, 1>" 4096x14336 > $OUT/src_mvi.csv 2>/dev/null
wc -l $OUT/src_mvi.csv
