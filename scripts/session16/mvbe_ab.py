"""Session 16, calls 8-9 (call 8 stopped at its own check: the records compared as floats, NaN patterns): the decode step's 8-warp products, mvbe with the residual add and the next norm's first half
(norm_out, records_out: the o-projection at 4096x4096 and the down product at 4096x14336 of an 8B llama), over
SG x D (call 7: 8B IQ3_XXS decode 482-494 tok/s with (8, 1, 1, 1, 1) everywhere against 499-505 with session 15's
(8, 1, 1, 0, 0)), after qxe, timed as lite.kernels.bench times the table's matvec rows; the forms interleaved R
times a shape, the medians of the R last; the outputs of the forms equal bit for bit.

    PYTHONPATH=tests python3 scripts/session16/mvbe_ab.py [R]
"""
import itertools
import statistics
import sys

import cupy as cp
import numpy as np
from kernel_blocks import random_blocks

from lite.kernels import bench, iq3_b16, matvec_mma

R = int(sys.argv[1]) if len(sys.argv) > 1 else 5
FORMS = [(8, 1, 1, 0, 0), (8, 1, 1, 0, 1), (8, 1, 1, 1, 0), (8, 1, 1, 1, 1)]
stream = cp.cuda.Stream(non_blocking=True)
rng = np.random.default_rng(0)
copy = bench.copy16_bandwidth(stream)
print(f"copy-vec16 {copy:.0f} GB/s")
table = []
for rows, cols in ((4096, 14336), (4096, 4096)):
    base = iq3_b16.repack(cp.asarray(random_blocks("IQ3_XXS", rows * cols // 256, rng)), rows, cols)
    rot = bench._rotation(base, stream)
    counted = rows * cols // 256 * 98
    x = cp.asarray(rng.standard_normal((1, cols)).astype(np.float32))
    res = cp.asarray(rng.standard_normal((1, rows)).astype(np.float32))
    g = cp.asarray(rng.uniform(0.5, 1.5, rows).astype(np.float32))
    bufs = dict(out=cp.empty((1, rows), cp.float32), xg=cp.empty((1, rows), cp.float32),
                part=cp.empty((1, rows // 16), cp.float32), scale=cp.empty(1, cp.float32),
                counter=cp.zeros(1, cp.int32), xr=cp.zeros((1, rows), cp.float32))

    def run(w, cta):
        matvec_mma.launch(w, x, bufs["out"], rows, cols, stream, cta=cta, epilogue="add", res=res,
                          norm_out=(g, 1e-6, bufs["xg"], bufs["part"], bufs["scale"], bufs["counter"]),
                          records_out=bufs["xr"])
    ref = None
    for cta in FORMS:
        run(base, cta)
        stream.synchronize()
        got = [bufs[k].view(cp.uint32).copy() for k in ("out", "xg", "scale", "xr")]   # bits (xr: words, NaN as floats)
        ref = got if ref is None else ref
        assert all(cp.array_equal(a, b) for a, b in zip(ref, got)), (rows, cols, cta)
    times = {cta: [] for cta in FORMS}
    for _ in range(R):
        for cta in FORMS:
            it = itertools.cycle(rot)
            t = bench._time_graph(lambda: run(next(it), cta), stream, max(len(rot), bench._launches_for(counted)))
            times[cta].append(t * 1e6)
    for cta in FORMS:
        m = statistics.median(times[cta])
        table.append((f"{rows}x{cols}", cta, m, min(times[cta]), max(times[cta])))
        print(table[-1], flush=True)
    del rot
print("| shape | mvbe 'add' + norm out + records, (warps, prefetch, align, signs_add, predecode) | us (median) | min-max |")
print("| --- | --- | ---: | --- |")
for s, cta, m, lo, hi in table:
    print(f"| {s} | {cta} | {m:.2f} | {lo:.2f}-{hi:.2f} |")
