"""Session 15: mvbc (x quantized inside the product by clusters of 8 CTAs, kernels/matvec_mma_src.py
lt_mvbc_quantize) against qxe + mvb (the kernel table's IQ3_XXS_B16 product) and mvb alone over x records made
beforehand, through matvec_mma.launch, in captured graphs of 40 launches over weight copies rotated through
256 MB as lite.kernels.bench does; each figure the lower of two medians of 7 replays, the variants interleaved.
Outputs must equal the qxe + mvb form's bit for bit.

    python3 scripts/session15/mvbc_ab.py

mvbc lost (calls 3-4: 1.4-2x slower at every shape but 768x2048) and was removed: this script needs kernels/ and
tests/ at commit bb789a8 (mvbc's last form). Call 3 (commit "mvbc: x quantized inside the product by clusters of 8 CTAs ..."): mvbc with x read from the cluster
at each block only; call 4 adds x copied from the cluster once and clusters of 4 and 2 (matvec_mma.CLUSTER).
"""
import statistics

import cupy as cp
import numpy as np

from lite.kernels import iq3_b16, matvec_mma, matvec_q8, pdl


def time_graph(fn, launches=40, repeats=7):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        fn(0, s)
        s.synchronize()
        s.begin_capture()
        for i in range(launches):
            fn(i, s)
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        ts = []
        for _ in range(repeats):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s)
            g.launch(s)
            e1.record(s)
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1000 / launches)
    return statistics.median(ts)


SMS = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
SHAPES = [(4096, 14336), (14336, 4096), (4096, 4096), (6144, 4096), (768, 2048)]
print("| shape | form | us | GB/s (GGUF bytes) | out = qxe + mvb's |\n| --- | --- | ---: | ---: | --- |")
for rows, cols in SHAPES:
    rng = cp.random.default_rng(0)
    blocks = rng.integers(0, 256, rows * cols // 256 * 98, dtype=np.uint8)
    blocks.reshape(-1, 98)[:, 0:2] = cp.asarray(np.array([0x3C00], np.uint16).view(np.uint8))   # d = 1
    first = iq3_b16.repack(blocks, rows, cols)
    recs = [first] + [first.copy() for _ in range(-(-(256 << 20) // first.nbytes) - 1)]
    x = cp.asarray(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32))
    cfg = matvec_mma.config(rows, cols, SMS)
    # (label, cta, records given, cluster size); call 3 ran mvbc (cluster 1: x from the cluster at each block) at 8
    forms = [("qxe + mvb", cfg, False, 8), ("mvb alone (records given)", cfg, True, 8)]
    forms += [(f"mvbc CL={c} {'x copied' if k == 2 else 'x remote'}", cfg + (k,), False, c)
              for c, k in ((8, 1), (8, 2), (4, 2), (2, 2), (4, 1))]
    # x's records as the quantizer writes them (for the alone form): one qxe + mvb launch leaves them in a buffer
    xr = cp.empty_like(x)
    mod = matvec_mma._module(cp.cuda.runtime.getDevice(), (matvec_mma.QUANTIZER, matvec_mma.kernel_name(*cfg)),
                             matvec_mma.module_head())
    pdl.call(mod.get_function(matvec_mma.QUANTIZER), matvec_q8.quantize_grid(1, cols), (128,), (x[0], xr[0], np.int32(cols)))
    outs, res = {}, {}
    for _ in range(2):
        for label, cta, alone, c in forms:
            out = cp.full((1, rows), cp.nan, cp.float32)
            kw = {"x_records": xr} if alone else {}

            def run(i, s, cta=cta, kw=kw, out=out, c=c):
                matvec_mma.CLUSTER = c                    # read at launch (the module head, the shared memory)
                matvec_mma.launch(recs[i % len(recs)], x, out, rows, cols, s, cta=cta, **kw)
            run(0, None)
            cp.cuda.runtime.deviceSynchronize()
            outs[label] = out.copy()
            res.setdefault(label, []).append(time_graph(run))
    nb = rows * cols // 256 * 98
    for label, cta, alone, c in forms:
        t = min(res[label])
        eq = bool(cp.array_equal(outs[label].view(cp.uint32), outs["qxe + mvb"].view(cp.uint32)))
        print(f"| {rows}x{cols} | {label} {cta} | {t:.2f} | {nb / t / 1e3:,.0f} | {eq} |", flush=True)
    del recs, first, blocks

matvec_mma.CLUSTER = 8
# The gated [gate; up] product (28672x4096, silu over interleaved rows, as the 8B decode step runs it) with and
# without writing its output as the down product's x records (records_out, pairs): what the records cost there.
rows, cols = 28672, 4096
rng = cp.random.default_rng(0)
blocks = rng.integers(0, 256, rows * cols // 256 * 98, dtype=np.uint8)
blocks.reshape(-1, 98)[:, 0:2] = cp.asarray(np.array([0x3C00], np.uint16).view(np.uint8))
first = iq3_b16.repack(blocks, rows, cols)
recs = [first] + [first.copy() for _ in range(-(-(256 << 20) // first.nbytes) - 1)]
x = cp.asarray(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32))
pairs = cp.zeros(rows // 32, cp.int32)
xrec = cp.empty((1, rows // 2), cp.float32)
res, outs = {}, {}
for _ in range(2):
    for label, kw in (("gated (qxe + mvbe)", {}), ("gated + records_out", {"records_out": xrec, "pairs": pairs})):
        out = cp.full((1, rows // 2), cp.nan, cp.float32)

        def run(i, s, kw=kw, out=out):
            matvec_mma.launch(recs[i % len(recs)], x, out, rows, cols, s, epilogue="silu", **kw)
        run(0, None)
        cp.cuda.runtime.deviceSynchronize()
        outs[label] = out.copy()
        res.setdefault(label, []).append(time_graph(run))
want = cp.empty_like(xrec)                            # what the quantizer makes of the gated output
qmod = matvec_mma._module(cp.cuda.runtime.getDevice(), (matvec_mma.QUANTIZER, matvec_mma.kernel_name(4, 2, 0, 1)),
                          matvec_mma.module_head())
pdl.call(qmod.get_function(matvec_mma.QUANTIZER), matvec_q8.quantize_grid(1, rows // 2), (128,),
         (outs["gated (qxe + mvbe)"][0], want[0], np.int32(rows // 2)))
cp.cuda.runtime.deviceSynchronize()
print("records = the quantizer's:", bool(cp.array_equal(want.view(cp.uint32), xrec.view(cp.uint32))))
nb = rows * cols // 256 * 98
for label in res:
    eq = bool(cp.array_equal(outs[label].view(cp.uint32), outs["gated (qxe + mvbe)"].view(cp.uint32)))
    print(f"| {rows}x{cols} silu | {label} | {min(res[label]):.2f} | {nb / min(res[label]) / 1e3:,.0f} | {eq} |")
print("pairs left at 0:", not bool(pairs.any()))
