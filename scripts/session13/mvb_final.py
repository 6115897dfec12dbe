"""Session 13: kernels/matvec_mma.py's mvb<W, P> (x in layout 18) against session 12's text
(scripts/session13/matvec_mma_s12.py; call 10 ran this at 1b4a5e4 beside call 8's text too, commit 3244366's
kernels/matvec_mma.py at S = 0, then a copy here; call 9 over a form never committed, the signed table 16 KB
aligned in dynamic shared memory: BENCHMARKS, session 13),
alone and after qxe, at the kernel table's shapes (captured graphs, the weights' copies rotated through 256 MB
as lite.kernels.bench does: calls 9-10 ran with 4 copies, which the L2 partly served; each figure the lower of
two medians of 7 replays of 40 launches, the variants interleaved); with --timeline also the timeline of 40
launches after qxe at 4096x14336 (LT_MVB_STAMPS).

    python3 scripts/session13/mvb_final.py [--timeline]
"""
import importlib.util
import statistics
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "session12"))
from mvb_ab import time_graph  # noqa: E402

from lite.kernels import iq3_b16, matvec_mma, matvec_q8, pdl  # noqa: E402



def _load(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


old = _load("matvec_mma_s12")   # scripts/session13/matvec_mma_s12.py: in git at 7bf5921 (removed in session 14)

VARIANTS = {(4096, 14336): ((8, 1), (8, 2)), (14336, 4096): ((4, 2), (4, 1)),
            (4096, 4096): ((8, 1),), (768, 2048): ((8, 1),), (6144, 4096): ((8, 1), (4, 2))}


def setup(rows, cols, rotate_bytes=256 << 20):
    """Copies of one random matrix's records (together past rotate_bytes) and a random x."""
    rng = cp.random.default_rng(0)
    blocks = rng.integers(0, 256, rows * cols // 256 * 98, dtype=np.uint8)
    blocks.reshape(-1, 98)[:, 0:2] = cp.asarray(np.array([0x3C00], np.uint16).view(np.uint8))   # d = 1
    first = iq3_b16.repack(blocks, rows, cols)
    return [first] + [first.copy() for _ in range(-(-rotate_bytes // first.nbytes) - 1)], \
        cp.asarray(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32))


def functions(cfg, stamps=False, extra=""):
    names = (matvec_mma.QUANTIZER, matvec_mma.kernel_name(*cfg))
    mod = matvec_mma._module(cp.cuda.runtime.getDevice(), names, matvec_mma.module_head(stamps, extra))
    return mod, mod.get_function(names[0]), mod.get_function(names[1])


def runner(quant, mv, warps, recs, x, xq, out, rows, cols):
    def run(i, with_q):
        if with_q:
            pdl.call(quant, matvec_q8.quantize_grid(1, cols), (128,), (x, xq, np.int32(cols)))
        pdl.call(mv, (rows // 16,), (32 * warps,), (recs[i % len(recs)], xq, out, np.int32(rows), np.int32(cols)))
    return run


def timings():
    dev = cp.cuda.runtime.getDevice()
    table = []
    for (rows, cols), vs in VARIANTS.items():
        recs, x = setup(rows, cols)
        xq = cp.empty_like(x)
        c12 = old.config(rows, cols, old._sms(dev))
        names = (old.QUANTIZER, old.kernel_name(*c12))
        m12 = old._module(dev, names, pdl.source_head())
        variants = [(f"s12 {c12}", m12.get_function(names[0]), m12.get_function(names[1]), c12[0])]
        for cfg in vs:
            _, q, mv = functions(cfg)
            variants.append((str(cfg), q, mv, cfg[0]))
        res, outs = {}, {}
        for _ in range(2):
            for name, q, mv, w in variants:
                out = cp.full((1, rows), cp.nan, cp.float32)
                run = runner(q, mv, w, recs, x, xq, out, rows, cols)
                run(0, True)
                cp.cuda.runtime.deviceSynchronize()
                outs[name] = out.copy()
                res.setdefault((name, 0), []).append(time_graph(lambda i: run(i, False)))
                res.setdefault((name, 1), []).append(time_graph(lambda i: run(i, True)))
        first = variants[0][0]
        for name, q, mv, w in variants:
            table.append((f"{rows}x{cols}", name, mv.num_regs, min(res[(name, 0)]), min(res[(name, 1)]),
                          bool(cp.array_equal(outs[first], outs[name]))))
            print(table[-1], flush=True)
    print("\n| shape | mvb<W, P> | regs | alone us | after qxe us | out = s12's |\n| --- | --- | ---: | ---: | ---: | --- |")
    for r in table:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} | {r[4]:.2f} | {r[5]} |")


def timeline(cfg, rows=4096, cols=14336, launches=40):
    recs, x = setup(rows, cols)
    mod, quant, mv = functions(cfg, stamps=True)
    xq, out = cp.empty_like(x), cp.empty((1, rows), cp.float32)
    run = runner(quant, mv, cfg[0], recs, x, xq, out, rows, cols)
    count = cp.ndarray((4096,), cp.uint32, memptr=mod.get_global("lt_mvb_count"))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        run(0, True)
        s.begin_capture()
        for i in range(launches):
            run(i, True)
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        count.fill(0)
        g.launch(s)
        s.synchronize()
    st = cp.ndarray((64, 4096, 8), cp.uint64, memptr=mod.get_global("lt_mvb_stamps"))[:launches, :rows // 16, :5].get().astype(np.int64)
    us = (st - st[:, :, 0].min()) / 1000.0
    keys = {"period (first past-wait to next)": lambda n, e: us[n + 1][:, 2].min() - e[:, 2].min(),
            "release after prev exit": lambda n, e: e[:, 2].min() - us[n - 1][:, 4].max(),
            "first past-wait - last entry": lambda n, e: e[:, 2].min() - e[:, 0].max(),
            "compute median": lambda n, e: float(np.median(e[:, 3] - e[:, 2])),
            "compute max": lambda n, e: float((e[:, 3] - e[:, 2]).max()),
            "done to exit median": lambda n, e: float(np.median(e[:, 4] - e[:, 3])),
            "last exit - first past-wait": lambda n, e: e[:, 4].max() - e[:, 2].min()}
    print(f"\ntimeline mvb<{cfg}> after qxe, {rows}x{cols} (us, median of launches 5-{launches - 2})")
    for k, f in keys.items():
        print(f"  {k}: {statistics.median(f(n, us[n]) for n in range(5, launches - 1)):.2f}")


if __name__ == "__main__":
    timings()
    if "--timeline" in sys.argv:
        timeline((8, 1))
