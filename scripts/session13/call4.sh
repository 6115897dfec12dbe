# Session 13, call 4: mvb with x's addresses at fixed steps and the tables at file scope (kernels/matvec_mma.py)
# against session 12's text; the GPU test; Nsight Compute (full set and SASS source counters) on the new form.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 120 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 200 python3 scripts/session13/mvb_ab13.py 2>&1 | tail -8
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
timeout 200 $NCU --clock-control none -k regex:mvb --launch-skip 2 --launch-count 1 --set full --page details python3 /tmp/one.py > $OUT/ncu_mvb.txt 2>&1
timeout 200 $NCU --clock-control none -k regex:mvb --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats --page source --print-source sass --csv python3 /tmp/one.py > $OUT/src_mvb.csv 2>/dev/null
grep -E "Duration|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\)|Issue Slots Busy|Achieved Occupancy|Registers Per|bank|No Eligible|Warp Cycles Per Issued|Mem Pipes|Shared Memory Configuration" $OUT/ncu_mvb.txt | head -24
