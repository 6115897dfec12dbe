"""Session 16, call 4 (at commit "mvb: LT_MVB_PREDECODE ...": the define is mvb's template parameter D since): mvb with each warp's first block decoded before the PDL wait (kernels/matvec_mma_src.py:
lt_b16_decode's A fragments need no x, so they are made while the quantizer before the product runs) against
without, at the kernel table's shapes after qxe, timed as lite.kernels.bench times the table's matvec rows; the
forms interleaved R times a shape, the medians of the R last. The outputs must be equal bit for bit (the same
arithmetic in the same order).

    python3 scripts/session16/predecode_ab.py [R]
"""
import itertools
import statistics
import sys

import cupy as cp
import numpy as np

from lite.kernels import bench, iq3_b16, matvec_mma

R = int(sys.argv[1]) if len(sys.argv) > 1 else 5
EXTRA = {"now": ""}
_head = matvec_mma.module_head
matvec_mma.module_head = lambda stamps=False, extra="": _head(stamps, extra + EXTRA["now"])
FORMS = {"as is": "", "predecode": "#define LT_MVB_PREDECODE\n"}
stream = cp.cuda.Stream(non_blocking=True)
rng = np.random.default_rng(0)
copy = bench.copy16_bandwidth(stream)
print(f"copy-vec16 {copy:.0f} GB/s")
table = []
for rows, cols in bench.SHAPES:
    from kernel_blocks import random_blocks       # tests/ on the path
    base = iq3_b16.repack(cp.asarray(random_blocks("IQ3_XXS", rows * cols // 256, rng)), rows, cols)
    rot = bench._rotation(base, stream)
    counted = rows * cols // 256 * 98
    x = cp.asarray(rng.standard_normal((1, cols)).astype(np.float32))
    outs = []
    for name, extra in FORMS.items():
        EXTRA["now"] = extra
        y = cp.empty((1, rows), cp.float32)
        matvec_mma.launch(base, x, y, rows, cols, stream)
        stream.synchronize()
        outs.append(y)
    assert all(cp.array_equal(outs[0], o) for o in outs[1:]), (rows, cols)
    got = {name: [] for name in FORMS}
    for _ in range(R):
        for name, extra in FORMS.items():
            EXTRA["now"] = extra
            y = cp.empty((1, rows), cp.float32)
            it = itertools.cycle(rot)
            t = bench._time_graph(lambda: matvec_mma.launch(next(it), x, y, rows, cols, stream), stream,
                                  max(len(rot), bench._launches_for(counted)))
            got[name].append(t * 1e6)
    for name in FORMS:
        m = statistics.median(got[name])
        table.append((f"{rows}x{cols}", name, m, counted / (m * 1e3) / copy * 100, min(got[name]), max(got[name])))
    del rot
print("| shape | form | us (median) | % of copy | min-max |")
print("| --- | --- | ---: | ---: | --- |")
for s, name, m, p, lo, hi in table:
    print(f"| {s} | {name} | {m:.2f} | {p:.1f} | {lo:.2f}-{hi:.2f} |")
