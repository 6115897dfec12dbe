"""Session 13, call 14: mvb's weights loaded with an L2 evict-first policy (kernels/matvec_mma.py LtStream, the
default) against plain loads (LT_MVB_NO_EVICT_FIRST), alone and after qxe, at the kernel table's shapes, weights
rotated through 256 MB as lite.kernels.bench does (40 launches a graph, the lower of two medians of 7 replays,
interleaved).

    python3 scripts/session13/mvb_evict.py
"""
import sys
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mvb_final as mf  # noqa: E402
from mvb_final import time_graph  # noqa: E402

from lite.kernels import matvec_mma  # noqa: E402

SHAPES = ((4096, 14336), (14336, 4096), (4096, 4096), (768, 2048))
PLAIN = "#define LT_MVB_NO_EVICT_FIRST\n"


def main():
    dev = cp.cuda.runtime.getDevice()
    table = []
    for rows, cols in SHAPES:
        recs, x = mf.setup(rows, cols)
        cfg = matvec_mma.config(rows, cols, matvec_mma._sms(dev))
        xq = cp.empty_like(x)
        variants = []
        for name, extra in (("plain loads", PLAIN), ("evict-first", "")):
            _, q, mv = mf.functions(cfg, extra=extra)
            variants.append((name, q, mv))
        res, outs = {}, {}
        for _ in range(2):
            for name, q, mv in variants:
                out = cp.full((1, rows), cp.nan, cp.float32)
                run = mf.runner(q, mv, cfg[0], recs, x, xq, out, rows, cols)
                run(0, True)
                cp.cuda.runtime.deviceSynchronize()
                outs[name] = out.copy()
                res.setdefault((name, 0), []).append(time_graph(lambda i: run(i, False)))
                res.setdefault((name, 1), []).append(time_graph(lambda i: run(i, True)))
        for name, q, mv in variants:
            table.append((f"{rows}x{cols}", str(cfg), name, mv.num_regs, min(res[(name, 0)]), min(res[(name, 1)]),
                          bool(cp.array_equal(outs["plain loads"], outs[name]))))
    print("| shape | (W, P) | weights | regs | alone us | after qxe us | out = plain's |\n| --- | --- | --- | ---: | ---: | ---: | --- |")
    for r in table:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.2f} | {r[5]:.2f} | {r[6]} |")


if __name__ == "__main__":
    main()
