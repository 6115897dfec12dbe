"""Session 16: mvb's warps a CTA (kernels/matvec_mma_src.py: at 12, 14 and 16 warps ptxas fits __launch_bounds__(32 W,
2) in 80, 72 and 64 registers without spills, so that 2 CTAs an SM hold 24-32 warps against 8 warps' 16) at the
kernel table's shapes after qxe (the PDL wait, LITE_MVB_HANDOFF=0), timed as lite.kernels.bench times the table's
matvec rows; the forms interleaved R times a shape, the medians of the R last. Outputs of every form equal the
first's within 1e-4 (float rounding of the warps' sums (the int8 sums are exact; the warps' order differs).

    python3 scripts/session16/warps_ab.py [R]
"""
import itertools
import os
import statistics
import sys

import cupy as cp
import numpy as np

from lite.kernels import bench, iq3_b16, matvec_mma

R = int(sys.argv[1]) if len(sys.argv) > 1 else 5
os.environ["LITE_MVB_HANDOFF"] = os.environ.get("LITE_MVB_HANDOFF", "0")
FORMS = {(4096, 14336): [(8, 1, 1, 0), (12, 1, 1, 0), (14, 1, 1, 0), (16, 1, 1, 0), (14, 1, 1, 1), (16, 1, 1, 1)],
         (4096, 4096): [(8, 1, 1, 0), (12, 1, 1, 0), (16, 1, 1, 0), (16, 1, 1, 1)],
         (14336, 4096): [(4, 2, 0, 1), (8, 1, 0, 1), (8, 1, 0, 0)],
         (768, 2048): [(8, 1, 1, 0), (16, 1, 1, 0)]}
stream = cp.cuda.Stream(non_blocking=True)
rng = np.random.default_rng(0)
copy = bench.copy16_bandwidth(stream)
print(f"copy-vec16 {copy:.0f} GB/s, LITE_MVB_HANDOFF={os.environ['LITE_MVB_HANDOFF']}")
table = []
for (rows, cols), forms in FORMS.items():
    from kernel_blocks import random_blocks       # tests/ on the path: valid blocks, finite outputs to compare
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    base = iq3_b16.repack(cp.asarray(blocks), rows, cols)
    rot = bench._rotation(base, stream)
    counted = rows * cols // 256 * 98
    x = cp.asarray(rng.standard_normal((1, cols)).astype(np.float32))
    ref = None
    for cta in forms:
        y = cp.empty((1, rows), cp.float32)
        with stream:
            matvec_mma.launch(base, x, y, rows, cols, stream, cta=cta)
        stream.synchronize()
        if ref is None:
            ref = y
        else:
            err = float(cp.max(cp.abs(y - ref) / (cp.abs(ref) + 1e-3 * float(cp.max(cp.abs(ref))))))
            assert err < 1e-4, (rows, cols, cta, err)
    got = {cta: [] for cta in forms}
    for _ in range(R):
        for cta in forms:
            y = cp.empty((1, rows), cp.float32)
            it = itertools.cycle(rot)
            t = bench._time_graph(lambda: matvec_mma.launch(next(it), x, y, rows, cols, stream, cta=cta), stream,
                                  max(len(rot), bench._launches_for(counted)))
            got[cta].append(t * 1e6)
    for cta in forms:
        m = statistics.median(got[cta])
        table.append((f"{rows}x{cols}", cta, m, counted / (m * 1e3) / copy * 100, min(got[cta]), max(got[cta])))
    del rot
print("| shape | (warps, prefetch, align, signs_add) | us (median) | % of copy | min-max |")
print("| --- | --- | ---: | ---: | --- |")
for s, cta, m, p, lo, hi in table:
    print(f"| {s} | {cta} | {m:.2f} | {p:.1f} | {lo:.2f}-{hi:.2f} |")
