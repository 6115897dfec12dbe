"""Session 13, call 3: one CTA of 16 warps an SM over 2 bands (mvb<16, P, 2>) against two CTAs of 8 warps
a band (mvb<8, 2, 1>). Call 2 found the SM's second CTA (blockIdx >= 132) computing ~1.3-1.7 us longer
than its first (6.5 against 7.8-8.2 us median; the warp schedulers favour the older warps), so that each
SM's last band ends late; 16 warps of one CTA share the SM's 2 bands as one sequence of records.

    python3 scripts/session13/mvb_w16.py

Ran at commit 1dc5554 (mvb's template then took bands, x's ring, x's layout, CTAs an SM; the
kernel has since lost those knobs).
"""
import sys
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mvb_bands as mb  # noqa: E402
from mvb_bands import time_graph  # noqa: E402
from mvb_spread import spread  # noqa: E402

SHAPES = {(4096, 14336): [(8, 2, 1), (16, 2, 2), (16, 1, 2), (16, 3, 2)],
          (14336, 4096): [(4, 2, 1), (16, 2, 7), (16, 1, 7), (8, 2, 4)],
          (4096, 4096): [(8, 1, 1), (16, 1, 2), (16, 2, 2)],
          (768, 2048): [(8, 1, 1), (16, 1, 2)]}


def main():
    table = []
    for (rows, cols), cfgs in SHAPES.items():
        recs, x = mb.setup(rows, cols)
        xq = cp.empty_like(x)
        ref = None
        for cfg in cfgs:
            _, quant, mv = mb.functions(*cfg)
            out = cp.full((1, rows), cp.nan, cp.float32)
            mb.enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, True)(0)
            cp.cuda.runtime.deviceSynchronize()
            ref = out.copy() if ref is None else ref
            err = float(cp.max(cp.abs(out - ref)) / cp.max(cp.abs(ref)))
            alone = time_graph(mb.enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, False))
            after = time_graph(mb.enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, True))
            table.append((f"{rows}x{cols}", str(cfg), mv.num_regs, alone, after, err))
            print(table[-1], flush=True)
    print("| shape | mvb<W, P, B> | regs | alone us | after qxe us | max diff / max of the first row's |\n"
          "| --- | --- | ---: | ---: | ---: | ---: |")
    for r in table:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.1e} |")
    for with_q in (True, False):
        spread((16, 2, 2), with_q)
        mb.timeline((16, 2, 2), with_q)


if __name__ == "__main__":
    main()
