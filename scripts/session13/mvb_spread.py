"""Session 13, call 2: why some of mvb's CTAs compute ~1.6 us longer than the median (call 1: 6.9 us median,
8.5 max at 4096x14336), and the signed table made from the grid words in each CTA (LT_MVB_TABCALC) instead
of read from L2 (call 1: the fill takes 1.1 us, and the last CTAs to enter pass the PDL wait 1.2 us late).

    python3 scripts/session13/mvb_spread.py

Ran at commit 1dc5554 (mvb's template then took bands, x's ring, x's layout, CTAs an SM; the
kernel has since lost those knobs).
"""
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mvb_bands as mb  # noqa: E402
from mvb_bands import time_graph  # noqa: E402

TABCALC = "#define LT_MVB_TABCALC\n"


def spread(cfg, with_q, extra=""):
    us, sm = mb.stamps(cfg, with_q, extra=extra)
    comp, start, done, ent = [], [], [], []
    lines = []
    for n in range(5, 38):
        e = us[n]
        base = e[:, 2].min()
        c = e[:, 3] - e[:, 2]
        counts = np.bincount(sm[n], minlength=132)
        mates = counts[sm[n]]                                  # CTAs of this launch on the CTA's SM
        order = np.argsort(-c)
        if n == 20:
            for i in order[:8]:
                lines.append(f"    slow CTA {i:3d} sm {sm[n][i]:3d} (CTAs there {mates[i]}) entry {e[i, 0] - base:+.2f} "
                             f"past-wait {e[i, 2] - base:+.2f} compute {c[i]:.2f} done {e[i, 3] - base:.2f}")
        comp.append(c)
        start.append(e[:, 2] - base)
        done.append(e[:, 3] - base)
        ent.append(e[:, 0] - base)
    comp, start, done, ent = map(np.array, (comp, start, done, ent))
    q = lambda a: " / ".join(f"{v:.2f}" for v in np.percentile(a, [10, 50, 90, 99, 100]))
    print(f"\nspread mvb<{cfg[0]}, {cfg[1]}, {cfg[2]}> {extra.strip()} {'after qxe' if with_q else 'alone'}: percentiles 10/50/90/99/100 over CTAs and launches 5-37")
    print(f"  compute (past-wait to done): {q(comp)}")
    print(f"  past-wait after the launch's first: {q(start)}")
    print(f"  done after the launch's first past-wait: {q(done)}")
    print(f"  entry after the launch's first past-wait: {q(ent)}")
    r = np.corrcoef(start.ravel(), comp.ravel())[0, 1]
    cid = np.tile(np.arange(comp.shape[1]), comp.shape[0])
    print(f"  corr(compute, late past-wait) {r:.2f}; corr(compute, blockIdx) {np.corrcoef(cid, comp.ravel())[0, 1]:.2f}")
    by = [np.median(comp[:, k::8]) for k in range(8)]
    print("  compute median by blockIdx % 8: " + " ".join(f"{v:.2f}" for v in by))
    half = comp.shape[1] // 2
    print(f"  compute median, first / second half of the CTAs: {np.median(comp[:, :half]):.2f} / {np.median(comp[:, half:]):.2f}")
    print("\n".join(lines))


def main():
    table = []
    for rows, cols, cfg in ((4096, 14336, (8, 2, 1)), (14336, 4096, (4, 2, 1)), (4096, 4096, (8, 1, 1))):
        recs, x = mb.setup(rows, cols)
        xq = cp.empty_like(x)
        ref = None
        for extra in ("", TABCALC):
            _, quant, mv = mb.functions(*cfg, extra=extra)
            out = cp.full((1, rows), cp.nan, cp.float32)
            mb.enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, True)(0)
            cp.cuda.runtime.deviceSynchronize()
            ref = out.copy() if ref is None else ref
            same = bool(cp.array_equal(out, ref))
            alone = time_graph(mb.enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, False))
            after = time_graph(mb.enqueue(quant, mv, cfg, recs, x, xq, out, rows, cols, True))
            table.append((f"{rows}x{cols}", str(cfg), extra.strip() or "-", mv.num_regs, alone, after, same))
    print("| shape | mvb<W, P, B> | defines | regs | alone us | after qxe us | out = default's |\n| --- | --- | --- | ---: | ---: | ---: | --- |")
    for r in table:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.2f} | {r[5]:.2f} | {r[6]} |")
    for extra in ("", TABCALC):
        for with_q in (False, True):
            spread((8, 2, 1), with_q, extra)
            mb.timeline((8, 2, 1), with_q, extra=extra)


if __name__ == "__main__":
    main()
