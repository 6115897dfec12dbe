"""Session 14: A/B of mvb's forms against session 13's text (scripts/session14/matvec_mma_s13.py), each over
its own module's repack of the same blocks, alone and after qxe, at the kernel table's shapes (captured graphs of
40 launches, the weights' copies rotated through 256 MB as lite.kernels.bench does; each figure the lower of two
medians of 7 replays, the variants interleaved). Outputs of the same warps a CTA must be equal bit for bit (the
int8 sums are exact, the float tail the same). With --timeline, the timelines after qxe at 4096x14336.
Call 1 (commit 8883359) ran it over the all-grid layout (every chunk's words from the grid's copies); call 2
over kernels/matvec_mma.py's defines LT_MVB_L1NA (the weights not allocated in L1) and LT_MVB_XSPLIT (the next
block's x loaded in halves as this block's chunk pairs finish with theirs); call 3 over LT_MVB_L1NA and LT_MVB_ALIGN
(the signed table 16 KB aligned in dynamic shared memory: a lookup's address one LOP3); call 4 over mvb<W, P, A>,
A = 1 that alignment (kernels/matvec_mma.py config's choice where it fits the CTAs in one round).

    python3 scripts/session14/mvb_ab14.py [--timeline]
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


old = _load("matvec_mma_s13")
# call 5 compared call 4's text (1496ab6, copied here then); today's default path compiles to the same SASS
c4 = matvec_mma
# call 9's T32 (every chunk's words through the signed table, its own repack): scripts/session14/matvec_mma_t32.py
# at 9896f1e, removed since (it lost); --signs needs it back from there
t32 = _load("matvec_mma_t32") if "--signs" in sys.argv else None
# (module, its name, CTA shape, module head's extra). Calls 2-3 took extras (defines since gone: LT_MVB_L1NA,
# LT_MVB_XSPLIT, LT_MVB_ALIGN); since call 4 the table's alignment is mvb's template parameter A (cfg's third).
# Session 13's text against today's, each at config's shape (call 5 also ran call 4's copy beside a form since
# reverted: x in layout 26, -x's words from qxe, the scales as 2 sc + 1 bytes a block; commit 8d1145f).
def _forms(cfg):
    return [(old, "s13", cfg[:2], ""), (matvec_mma, "s14", cfg, "")]


FORMS = {(4096, 14336): _forms((8, 1, 1, 0)), (14336, 4096): _forms((4, 2, 0, 1)), (4096, 4096): _forms((8, 1, 1, 0)),
         (768, 2048): _forms((8, 1, 1, 0)), (6144, 4096): _forms((4, 2, 1, 1))}      # config's choices since call 12
# --diag (call 6): kernels/matvec_mma.py's diagnostics, wrong products on purpose: the weights from 2 records a band
# (no DRAM), x from the first block (no L2), both
DIAG_W, DIAG_X = "#define LT_MVB_DIAG_W\n", "#define LT_MVB_DIAG_X\n"
IMASK = "#define LT_MVB_IMASK\n"     # in kernels/matvec_mma.py at f4cb10a-9896f1e only (calls 7-9), since removed
if "--imask" in sys.argv:      # call 7: the B fragments' masks as IMADs (the FMA pipe) against LOP3s (the ALU pipe)
    FORMS = {shape: [(matvec_mma, "s14", cfg, e) for e in ("", IMASK)]
             for shape, cfg in (((4096, 14336), (8, 1, 1)), ((14336, 4096), (4, 2, 0)), ((4096, 4096), (8, 1, 1)),
                                ((6144, 4096), (4, 2, 1)), ((768, 2048), (8, 1, 1)))}
NOMMA, NOTAB, NOGRID = "#define LT_MVB_DIAG_NOMMA\n", "#define LT_MVB_DIAG_NOTAB\n", "#define LT_MVB_DIAG_NOGRID\n"
SPLITS = {(4096, 14336): [(8, 1, 1, 1, 0), (8, 1, 1, 1, 1), (4, 2, 0, 1, 0), (4, 2, 0, 2, 0), (4, 2, 0, 2, 1)],
          (14336, 4096): [(4, 2, 0, 1, 0), (4, 2, 0, 1, 1)], (6144, 4096): [(4, 2, 1, 1, 0), (4, 2, 1, 1, 1)],
          (4096, 4096): [(8, 1, 1, 1, 0), (4, 2, 0, 2, 0), (4, 2, 0, 2, 1)],
          (768, 2048): [(8, 1, 1, 1, 0), (8, 1, 1, 1, 1), (4, 2, 0, 2, 1)]}
if "--split" in sys.argv:      # call 11 (needs this file and kernels/matvec_mma.py at 4165ed2): mvb<W, P, A, S, SG>
    FORMS = {shape: [(matvec_mma, "s14", cfg, "") for cfg in cfgs] for shape, cfgs in SPLITS.items()}
SIGNADD = "#define LT_MVB_SIGNADD\n"   # in kernels/matvec_mma.py at 9896f1e only (call 9), since removed
if "--signs" in sys.argv:      # call 9: the odd chunk's signs added on the CUDA cores (no second mma), and T32
    FORMS = {shape: [(matvec_mma, "s14", cfg, ""), (matvec_mma, "s14", cfg, SIGNADD), (t32, "t32", cfg, "")]
             for shape, cfg in (((4096, 14336), (8, 1, 1)), ((14336, 4096), (4, 2, 0)), ((4096, 4096), (8, 1, 1)),
                                ((6144, 4096), (4, 2, 1)), ((768, 2048), (8, 1, 1)))}
elif "--diag2" in sys.argv:      # call 8: with no memory traffic (W + X), each of the compute's parts taken away
    WX = DIAG_W + DIAG_X
    FORMS = {shape: [(matvec_mma, "s14", cfg, e) for e in ("", WX, WX + NOMMA, WX + NOTAB, WX + NOGRID, WX + NOTAB + NOGRID,
                                                         WX + NOMMA + NOTAB + NOGRID)]
             for shape, cfg in (((4096, 14336), (8, 1, 1)), ((14336, 4096), (4, 2, 0)))}
elif "--diag" in sys.argv:
    FORMS = {shape: [(matvec_mma, "s14", cfg, e) for e in ("", DIAG_W, DIAG_X, DIAG_W + DIAG_X)]
             for shape, cfg in (((4096, 14336), (8, 1, 1)), ((14336, 4096), (4, 2, 0)), ((4096, 4096), (8, 1, 1)))}


def blocks_and_x(rows, cols):
    rng = cp.random.default_rng(0)
    blocks = rng.integers(0, 256, rows * cols // 256 * 98, dtype=np.uint8)
    blocks.reshape(-1, 98)[:, 0:2] = cp.asarray(np.array([0x3C00], np.uint16).view(np.uint8))   # d = 1
    return blocks, cp.asarray(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32))


def copies(mod, blocks, rows, cols, rotate_bytes=256 << 20):
    first = (getattr(mod, "repack", None) or iq3_b16.repack)(blocks, rows, cols)   # since call 4 in kernels/iq3_b16.py
    return [first] + [first.copy() for _ in range(-(-rotate_bytes // first.nbytes) - 1)]


def functions(mod, cfg, stamps=False, extra=""):
    names = (mod.QUANTIZER, mod.kernel_name(*cfg))
    m = mod._module(cp.cuda.runtime.getDevice(), names, mod.module_head(stamps, extra))
    q, mv = m.get_function(names[0]), m.get_function(names[1])
    DYN[id(mv)] = mod.ALIGN_DYN if len(cfg) > 2 and cfg[2] else 0     # cfg: (W, P[, A, SG])
    if DYN[id(mv)]:
        mv.max_dynamic_shared_size_bytes = DYN[id(mv)]      # 32 KB static + 31 KB dynamic: past 48 KB
    return m, q, mv


DYN = {}          # a function's dynamic shared memory (LT_MVB_ALIGN), by id


def runner(quant, mv, warps, recs, x, xq, out, rows, cols):
    """(Call 11 ran a form whose mvb took a K split's two more arguments: this file at 4165ed2.)"""
    def run(i, with_q):
        if with_q:
            pdl.call(quant, matvec_q8.quantize_grid(1, cols), (128,), (x, xq, np.int32(cols)))
        pdl.call(mv, (rows // 16,), (32 * warps,), (recs[i % len(recs)], xq, out, np.int32(rows), np.int32(cols)),
                 shared_mem=DYN.get(id(mv), 0))
    return run


def timings():
    table = []
    for (rows, cols), forms in FORMS.items():
        blocks, x = blocks_and_x(rows, cols)
        recs = {}
        xq = cp.empty_like(x)
        variants = []
        for mod, label, cfg, extra in forms:
            label_r = "t32" if mod is t32 else "b16"
            if label_r not in recs:
                recs[label_r] = copies(mod, blocks, rows, cols)
            _, q, mv = functions(mod, cfg, extra=extra)
            tag = " ".join(d.split()[1][7:] for d in extra.strip().split("\n") if d)
            variants.append((f"{label} {cfg} {tag}".strip(), q, mv, cfg[0], recs[label_r]))
        del blocks
        res, outs = {}, {}
        for _ in range(2):
            for name, q, mv, w, rr in variants:
                out = cp.full((1, rows), cp.nan, cp.float32)
                run = runner(q, mv, w, rr, x, xq, out, rows, cols)
                run(0, True)
                cp.cuda.runtime.deviceSynchronize()
                outs[name] = out.copy()
                res.setdefault((name, 0), []).append(time_graph(lambda i: run(i, False)))
                res.setdefault((name, 1), []).append(time_graph(lambda i: run(i, True)))
        first = variants[0][0]
        for name, q, mv, w, rr in variants:
            table.append((f"{rows}x{cols}", name, mv.num_regs, min(res[(name, 0)]), min(res[(name, 1)]),
                          bool(cp.array_equal(outs[first], outs[name]))))
            print(table[-1], flush=True)
        del recs
    print("\n| shape | form (W, P) | regs | alone us | after qxe us | out = s13's |\n| --- | --- | ---: | ---: | ---: | --- |")
    for r in table:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} | {r[4]:.2f} | {r[5]} |")


def timeline(mod, label, cfg, rows=4096, cols=14336, launches=40, extra=""):
    blocks, x = blocks_and_x(rows, cols)
    recs = copies(mod, blocks, rows, cols)
    m, quant, mv = functions(mod, cfg, stamps=True, extra=extra)
    xq, out = cp.empty_like(x), cp.empty((1, rows), cp.float32)
    run = runner(quant, mv, cfg[0], recs, x, xq, out, rows, cols)
    count = cp.ndarray((4096,), cp.uint32, memptr=m.get_global("lt_mvb_count"))
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
    st = cp.ndarray((64, 4096, 8), cp.uint64, memptr=m.get_global("lt_mvb_stamps"))[:launches, :rows // 16, :5].get().astype(np.int64)
    us = (st - st[:, :, 0].min()) / 1000.0
    keys = {"period (first past-wait to next)": lambda n, e: us[n + 1][:, 2].min() - e[:, 2].min(),
            "release after prev exit": lambda n, e: e[:, 2].min() - us[n - 1][:, 4].max(),
            "compute median": lambda n, e: float(np.median(e[:, 3] - e[:, 2])),
            "compute max": lambda n, e: float((e[:, 3] - e[:, 2]).max()),
            "done to exit median": lambda n, e: float(np.median(e[:, 4] - e[:, 3]))}
    print(f"\ntimeline {label} mvb<{cfg}> after qxe, {rows}x{cols} (us, median of launches 5-{launches - 2})")
    for k, f in keys.items():
        print(f"  {k}: {statistics.median(f(n, us[n]) for n in range(5, launches - 1)):.2f}")


if __name__ == "__main__":
    timings()
    if "--timeline" in sys.argv:
        timeline(old, "s13", (8, 1))
        timeline(matvec_mma, "s14", (8, 1, 1))
