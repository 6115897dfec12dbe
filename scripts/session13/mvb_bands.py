"""Session 13: mvb<W, P, B> (kernels/matvec_mma.py) with B bands a CTA (a grid of bands / B: one CTA an SM,
so that the next product's CTAs load their tables and first blocks beside this one's) against B = 1,
alone and after qxe, at the kernel table's shapes (captured graphs, weights rotated past the L2); then
the timeline of 40 launches from each CTA's globaltimer stamps (LT_MVB_STAMPS): entry, tables filled,
past the PDL wait, products done, exit.

    python3 scripts/session13/mvb_bands.py [--stamps-only]

Ran at commit 1dc5554 (mvb's template then took bands, x's ring, x's layout, CTAs an SM; the
kernel has since lost those knobs).
"""
import statistics
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "session12"))
from mvb_ab import time_graph  # noqa: E402

from lite.kernels import matvec_mma, matvec_q8, pdl  # noqa: E402

SHAPES = {(4096, 14336): [(8, 2, 1), (8, 1, 2), (8, 2, 2), (8, 3, 2), (8, 2, 2, "nocap")],
          (14336, 4096): [(4, 2, 1), (8, 2, 1), (8, 2, 7), (8, 1, 7), (8, 2, 4)],
          (4096, 4096): [(8, 1, 1), (8, 2, 1), (8, 1, 2), (8, 2, 2)]}


def functions(w, p, b, cap=True, stamps=False, extra="", xring=0, xlayout=20, min_ctas=None):
    head = matvec_mma.module_head(b if cap else 1, stamps, extra)
    names = (matvec_mma.quantizer_name(xlayout), matvec_mma.kernel_name(w, p, b, xring, xlayout, min_ctas))
    mod = matvec_mma._module(cp.cuda.runtime.getDevice(), names, head)
    return mod, mod.get_function(names[0]), mod.get_function(names[1])


def setup(rows, cols):
    rng = cp.random.default_rng(0)
    blocks = rng.integers(0, 256, rows * cols // 256 * 98, dtype=np.uint8)
    blocks.reshape(-1, 98)[:, 0:2] = cp.asarray(np.array([0x3C00], np.uint16).view(np.uint8))   # d = 1
    recs = [matvec_mma.repack(blocks, rows, cols) for _ in range(4)]
    x = cp.asarray(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32))
    return recs, x


def enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, with_q):
    w, p, b = cfg[:3]
    grid = (-(-rows // 16 // b),)

    def fn(i):
        if with_q:
            pdl.call(quant, matvec_q8.quantize_grid(1, cols), (128,), (x, xq, np.int32(cols)))
        pdl.call(mv, grid, (32 * w,), (recs[i % 4], xq, out, np.int32(rows), np.int32(cols)))
    return fn


def timings():
    table = []
    for (rows, cols), cfgs in SHAPES.items():
        recs, x = setup(rows, cols)
        xq, ref = cp.empty_like(x), None
        for cfg in cfgs:
            _, quant, mv = functions(*cfg[:3], cap=len(cfg) == 3)
            out = cp.full((1, rows), cp.nan, cp.float32)
            enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, True)(0)
            cp.cuda.runtime.deviceSynchronize()
            ref = out.copy() if ref is None else ref
            same = bool(cp.array_equal(out, ref))
            alone = time_graph(enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, False))
            after = time_graph(enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, True))
            table.append((f"{rows}x{cols}", str(cfg), mv.num_regs, alone, after, same))
            print(table[-1], flush=True)
    print("\n| shape | mvb<W, P, B> | regs | alone us | after qxe us | out = B=1's |\n| --- | --- | ---: | ---: | ---: | --- |")
    for r in table:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} | {r[4]:.2f} | {r[5]} |")


def stamps(cfg, with_q, rows=4096, cols=14336, launches=40, extra="", **kw):
    """[launch][CTA][event] in us from the first entry (events 0-4) and the SM (column 7); kw: functions'."""
    recs, x = setup(rows, cols)
    mod, quant, mv = functions(*cfg, stamps=True, extra=extra, **kw)
    xq, out = cp.empty_like(x), cp.empty((1, rows), cp.float32)
    fn = enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, with_q)
    s = cp.cuda.Stream(non_blocking=True)
    count = cp.ndarray((4096,), cp.uint32, memptr=mod.get_global("lt_mvb_count"))
    with s:
        fn(0)
        s.begin_capture()
        for i in range(launches):
            fn(i)
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        count.fill(0)
        g.launch(s)
        s.synchronize()
    ctas = -(-rows // 16 // cfg[2])
    st = cp.ndarray((64, 4096, 8), cp.uint64, memptr=mod.get_global("lt_mvb_stamps"))[:launches, :ctas].get().astype(np.int64)
    sm = st[:, :, 7].copy()
    t = st[:, :, :5] - st[:, :, 0].min()
    return t / 1000.0, sm


def timeline(cfg, with_q, launches=40, extra="", **kw):
    us, _ = stamps(cfg, with_q, launches=launches, extra=extra, **kw)
    rows_ = []
    for n in range(5, launches - 1):
        e = us[n]
        rows_.append({
            "period (first past-wait to next)": us[n + 1][:, 2].min() - e[:, 2].min(),
            "release after prev exit (first past-wait - prev last exit)": e[:, 2].min() - us[n - 1][:, 4].max(),
            "last past-wait - first": e[:, 2].max() - e[:, 2].min(),
            "first past-wait - last entry": e[:, 2].min() - e[:, 0].max(),
            "CTAs entered after the release": float((e[:, 0] > e[:, 2].min()).sum()),
            "fill (median)": float(np.median(e[:, 1] - e[:, 0])),
            "compute (median past-wait to done)": float(np.median(e[:, 3] - e[:, 2])),
            "compute (max)": float((e[:, 3] - e[:, 2]).max()),
            "done to exit (median)": float(np.median(e[:, 4] - e[:, 3])),
            "last exit - first past-wait": e[:, 4].max() - e[:, 2].min(),
        })
    print(f"\ntimeline mvb<{cfg[0]}, {cfg[1]}, {cfg[2]}> {kw or ''} {extra.strip()} {'after qxe' if with_q else 'alone'} (us, median of launches 5-{launches - 2})")
    for k in rows_[0]:
        print(f"  {k}: {statistics.median(r[k] for r in rows_):.2f}")


if __name__ == "__main__":
    if "--stamps-only" not in sys.argv:
        timings()
    for cfg in ((8, 2, 1), (8, 2, 2)):
        for with_q in (False, True):
            timeline(cfg, with_q)
