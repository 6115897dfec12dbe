"""Session 16, call 1 (needs kernels/matvec_mma.py at ce093de; the hand-off was removed after this call: even): IQ3_XXS_B16's product with the quantizer's hand-off by count (qxa + mvbh, LITE_MVB_HANDOFF=1, the
default) against the PDL wait (qxe + mvb, LITE_MVB_HANDOFF=0), at the kernel table's shapes, timed as
lite.kernels.bench times the table's matvec rows (captured graphs, the weights' copies rotated past the L2); the
two forms alternate R times a shape, each figure the median of its graph's replays; the medians of the R last.

    python3 scripts/session16/handoff_ab.py [R]
"""
import itertools
import os
import statistics
import sys

import cupy as cp
import numpy as np

from lite.kernels import bench, iq3_b16, matvec_mma

R = int(sys.argv[1]) if len(sys.argv) > 1 else 5
stream = cp.cuda.Stream(non_blocking=True)
rng = np.random.default_rng(0)
copy = bench.copy16_bandwidth(stream)
print(f"copy-vec16 {copy:.0f} GB/s")
rows_out = []
for rows, cols in bench.SHAPES:
    nb = iq3_b16.nbytes(rows, cols)
    counted = rows * cols // 256 * 98          # the table's bound: the file's IQ3_XXS bytes
    base = cp.asarray(rng.integers(0, 256, nb, dtype=np.uint8))
    rot = bench._rotation(base, stream)
    x = cp.asarray(rng.standard_normal((1, cols)).astype(np.float32))
    y = cp.empty((1, rows), cp.float32)
    got = {"0": [], "1": []}
    for _ in range(R):
        for h in ("0", "1"):
            os.environ["LITE_MVB_HANDOFF"] = h
            it = itertools.cycle(rot)
            t = bench._time_graph(lambda: matvec_mma.launch(next(it), x, y, rows, cols, stream), stream,
                                  max(len(rot), bench._launches_for(nb)))
            got[h].append(t * 1e6)
    m0, m1 = statistics.median(got["0"]), statistics.median(got["1"])
    rows_out.append((f"{rows}x{cols}", m0, m1, counted / (m0 * 1e3) / copy * 100, counted / (m1 * 1e3) / copy * 100,
                     min(got["1"]), max(got["1"])))
print("| shape | PDL wait (qxe + mvb) us | hand-off (qxa + mvbh) us | % of copy | % of copy | hand-off min-max |")
print("| --- | ---: | ---: | ---: | ---: | --- |")
for s, m0, m1, p0, p1, lo, hi in rows_out:
    print(f"| {s} | {m0:.2f} | {m1:.2f} | {p0:.1f} | {p1:.1f} | {lo:.2f}-{hi:.2f} |")
