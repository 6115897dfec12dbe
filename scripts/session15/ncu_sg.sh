# Written at the end of session 14 for session 15 (never run): Nsight Compute on mvb<8, 1, 1, 0> (config's form at
# 4096x14336) and mvb<8, 1, 1, 1> (the signs by an add: 8 mma a block against 12, yet 9.75 -> 10.74 us after qxe in
# session 14's call 11, while it wins at 4 warps a CTA). Stall reasons, pipe use and issue side by side: what the
# 8-warp form waits on once 4 of its 12 mma are gone. Needs the device's ncu (session 13's call 15 found it there).
source scripts/device_setup.sh >/dev/null 2>&1
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
cat > /tmp/one_sg.py <<'PY'
import sys
import cupy as cp, numpy as np
from lite.kernels import iq3_b16, matvec_mma
sg = int(sys.argv[1])
rows, cols = 4096, 14336
b = cp.random.default_rng(0).integers(0, 256, rows * cols // 256 * 98, dtype=np.uint8)
b.reshape(-1, 98)[:, 0:2] = cp.asarray(np.array([0x3C00], np.uint16).view(np.uint8))
r = iq3_b16.repack(b, rows, cols)
x = cp.asarray(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32))
out = cp.empty((1, rows), cp.float32)
for _ in range(3):
    matvec_mma.launch(r, x, out, rows, cols, cta=(8, 1, 1, sg))
cp.cuda.Device().synchronize()
PY
for sg in 0 1; do
  timeout 150 $NCU --clock-control none -k regex:mvb --launch-skip 2 --launch-count 1 --set full --page details \
    python3 /tmp/one_sg.py $sg > $OUT/ncu_sg$sg.txt 2>&1
  echo "== mvb<8, 1, 1, $sg>"
  grep -E "Duration|Compute \(SM\)|Issue Slots Busy|Achieved Occupancy|Registers Per|No Eligible|Warp Cycles Per Issued|highest-utilized|Stall" \
    $OUT/ncu_sg$sg.txt | head -20
done
