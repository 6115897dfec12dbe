"""Session 16, calls 6-7 (and, with --warps / --d, what calls 3 / 4 ran as warps_ab.py / predecode_ab.py): mvb's forms (warps, prefetch, align, signs_add, predecode) at the kernel table's shapes and
6144x4096 (the 8-warp shapes: SG and D, the first block decoded before the PDL wait, each on and off; call 5's
timeline had (8, 1, 1, 1, 1) at 9.42 us after qxe against (8, 1, 1, 0, 0)'s 9.91) after qxe, timed as
lite.kernels.bench times the table's matvec rows; the forms interleaved R times a shape, the medians of the R last.
The outputs of a shape's forms equal bit for bit (the int8 sums exact either way, the tail the same).

    PYTHONPATH=tests python3 scripts/session16/forms_ab.py [R] [--warps | --d | --wide]
"""
import itertools
import statistics
import sys

import cupy as cp
import numpy as np
from kernel_blocks import random_blocks       # tests/ on the path: valid blocks, finite outputs to compare

from lite.kernels import bench, iq3_b16, matvec_mma

R = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 5
E8 = [(8, 1, 1, 0, 0), (8, 1, 1, 0, 1), (8, 1, 1, 1, 0), (8, 1, 1, 1, 1)]
FORMS = {(4096, 14336): E8, (4096, 4096): E8, (768, 2048): E8,
         (6144, 4096): [(4, 2, 1, 1, 0), (4, 2, 1, 1, 1), (8, 1, 1, 1, 1)], (14336, 4096): [(4, 2, 0, 1, 0)]}
if "--warps" in sys.argv:      # call 3 (then scripts/session16/warps_ab.py): 12-16 warps a CTA, which ptxas fits in 80-64
    FORMS = {(4096, 14336): [(8, 1, 1, 0), (12, 1, 1, 0), (14, 1, 1, 0), (16, 1, 1, 0), (14, 1, 1, 1), (16, 1, 1, 1)],
             (4096, 4096): [(8, 1, 1, 0), (12, 1, 1, 0), (16, 1, 1, 0), (16, 1, 1, 1)],   # registers (no spills)
             (14336, 4096): [(4, 2, 0, 1), (8, 1, 0, 1), (8, 1, 0, 0)], (768, 2048): [(8, 1, 1, 0), (16, 1, 1, 0)]}
if "--d" in sys.argv:          # call 4 (then predecode_ab.py, D as a define): D at config's session-15 forms
    FORMS = {shape: [cta + (0,), cta + (1,)] for shape, cta in (((4096, 4096), (8, 1, 1, 0)),
             ((14336, 4096), (4, 2, 0, 1)), ((4096, 14336), (8, 1, 1, 0)), ((768, 2048), (8, 1, 1, 0)))}
if "--wide" in sys.argv:       # call 7: the shapes past 2 CTAs an SM (8B's qkv, the table's 14336x4096, gate/up)
    FORMS = {(6144, 4096): [(4, 2, 1, 1, 0), (4, 2, 1, 1, 1), (8, 1, 1, 1, 1), (8, 1, 1, 1, 0)],
             (14336, 4096): [(4, 2, 0, 1, 0), (4, 2, 0, 1, 1), (8, 1, 1, 1, 1)],
             (28672, 4096): [(4, 2, 0, 1, 0), (8, 1, 1, 1, 1)]}
stream = cp.cuda.Stream(non_blocking=True)
rng = np.random.default_rng(0)
copy = bench.copy16_bandwidth(stream)
print(f"copy-vec16 {copy:.0f} GB/s")
table = []
for (rows, cols), forms in FORMS.items():
    base = iq3_b16.repack(cp.asarray(random_blocks("IQ3_XXS", rows * cols // 256, rng)), rows, cols)
    rot = bench._rotation(base, stream)
    counted = rows * cols // 256 * 98
    x = cp.asarray(rng.standard_normal((1, cols)).astype(np.float32))
    ref = None
    for cta in forms:
        y = cp.empty((1, rows), cp.float32)
        matvec_mma.launch(base, x, y, rows, cols, stream, cta=cta)
        stream.synchronize()
        ref = (cta[0], y) if ref is None else ref
        if cta[0] == ref[0]:          # the same warps a CTA: the same sums in the same order
            assert cp.array_equal(y, ref[1]), (rows, cols, cta)
        else:                         # the warps' partial sums added in another order (call 6 stopped here)
            assert float(cp.max(cp.abs(y - ref[1]))) <= 1e-4 * float(cp.max(cp.abs(ref[1]))), (rows, cols, cta)
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
        print(table[-1], flush=True)
    del rot
print("| shape | (warps, prefetch, align, signs_add, predecode) | us (median) | % of copy | min-max |")
print("| --- | --- | ---: | ---: | --- |")
for s, cta, m, p, lo, hi in table:
    print(f"| {s} | {cta} | {m:.2f} | {p:.1f} | {lo:.2f}-{hi:.2f} |")
