# Session 13, call 15: Nsight Compute (full set, SASS source counters) on the final mvb<8, 1> at 4096x14336 (through
# launch(): qxe<.., 18> then mvb), for the next session.
source scripts/device_setup.sh >/dev/null 2>&1
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
cat > /tmp/one.py <<'PY'
import cupy as cp, numpy as np
from lite.kernels import matvec_mma
rows, cols = 4096, 14336
b = cp.random.default_rng(0).integers(0, 256, rows * cols // 256 * 98, dtype=np.uint8)
b.reshape(-1, 98)[:, 0:2] = cp.asarray(np.array([0x3C00], np.uint16).view(np.uint8))
r = matvec_mma.repack(b, rows, cols)
x = cp.asarray(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32))
out = cp.empty((1, rows), cp.float32)
for _ in range(3):
    matvec_mma.launch(r, x, out, rows, cols)
cp.cuda.Device().synchronize()
PY
timeout 150 $NCU --clock-control none -k regex:mvb --launch-skip 2 --launch-count 1 --set full --page details python3 /tmp/one.py > $OUT/ncu_mvb.txt 2>&1
timeout 150 $NCU --clock-control none -k regex:mvb --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats --page source --print-source sass --csv python3 /tmp/one.py > $OUT/src_mvb.csv 2>/dev/null
grep -E "Duration|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\)|Issue Slots Busy|Achieved Occupancy|Registers Per|bank|No Eligible|Warp Cycles Per Issued" $OUT/ncu_mvb.txt | head -16
