"""Session 13: kernels/matvec_mma.py's mvb as it stands against session 12's (scripts/session13/matvec_mma_s12.py,
its text at a130ed3), alone and after qxe, at the kernel table's shapes (captured graphs, weights rotated
past the L2; each figure the median of 7 replays of 40 launches), the runs interleaved.

    python3 scripts/session13/mvb_ab13.py [extra defines for the new module, e.g. LT_MVB_X=1]

Variants beside session 12's config (W, P) for the shape: (W, P, x in the ring, x's layout, CTAs an SM) as VARIANTS.

Ran at commit 1dc5554 (mvb's template then took bands, x's ring, x's layout, CTAs an SM; the
kernel has since lost those knobs).
"""
import importlib.util
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mvb_bands as mb  # noqa: E402
from mvb_bands import time_graph  # noqa: E402

from lite.kernels import matvec_mma, matvec_q8, pdl  # noqa: E402

_spec = importlib.util.spec_from_file_location("matvec_mma_s12", Path(__file__).resolve().parent / "matvec_mma_s12.py")
old = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(old)

VARIANTS = {(4096, 14336): ((8, 1, 0, 18, 2), (8, 1, 0, 18, 3), (8, 1, 1, 18, 3), (8, 2, 0, 18, 2)),
            (14336, 4096): ((4, 2, 0, 18, 2), (4, 1, 1, 18, 2), (8, 1, 0, 18, 3), (8, 1, 1, 18, 3), (4, 1, 1, 18, 5),
                            (4, 1, 0, 18, 6)),
            (4096, 4096): ((8, 1, 0, 18, 2), (8, 1, 0, 18, 3), (8, 1, 1, 18, 3)),
            (768, 2048): ((8, 1, 0, 18, 2), (8, 1, 0, 18, 3))}


def old_functions(w, p):
    names = (old.QUANTIZER, old.kernel_name(w, p))
    mod = old._module(cp.cuda.runtime.getDevice(), names, pdl.source_head())
    return mod.get_function(names[0]), mod.get_function(names[1])


def main():
    extra = "".join(f"#define {d.split('=')[0]} {d.split('=')[1] if '=' in d else ''}\n" for d in sys.argv[1:])
    dev = cp.cuda.runtime.getDevice()
    rows_out = []
    for (rows, cols), vs in VARIANTS.items():
        recs, x = mb.setup(rows, cols)
        cfg = matvec_mma.config(rows, cols, matvec_mma._sms(dev))
        xq = cp.empty_like(x)
        q_old, mv_old = old_functions(*cfg)
        variants = [("s12", q_old, mv_old, cfg[0])]
        for v in vs:
            _, q, mv = mb.functions(v[0], v[1], 1, extra=extra, xring=v[2], xlayout=v[3], min_ctas=v[4])
            variants.append((f"W{v[0]} P{v[1]} XR{v[2]} XL{v[3]} MB{v[4]}", q, mv, v[0]))
        grid = (rows // 16,)
        res, outs = {}, {}
        for rep in range(2):
            for name, q, mv, w in variants:
                out = cp.full((1, rows), cp.nan, cp.float32)

                def run(i, with_q):
                    if with_q:
                        pdl.call(q, matvec_q8.quantize_grid(1, cols), (128,), (x, xq, np.int32(cols)))
                    pdl.call(mv, grid, (32 * w,), (recs[i % 4], xq, out, np.int32(rows), np.int32(cols)))
                run(0, True)
                cp.cuda.runtime.deviceSynchronize()
                outs[name] = out.copy()
                res.setdefault((name, "alone"), []).append(time_graph(lambda i: run(i, False)))
                res.setdefault((name, "after qxe"), []).append(time_graph(lambda i: run(i, True)))
        for name, q, mv, w in variants:
            same = bool(cp.array_equal(outs["s12"], outs[name]))
            rows_out.append((f"{rows}x{cols}", name if name != "s12" else f"s12 (W{cfg[0]} P{cfg[1]})", mv.num_regs, min(res[(name, "alone")]),
                             min(res[(name, "after qxe")]), same))
            print(rows_out[-1], flush=True)
    print(f"\nnew module defines: {extra.strip() or '-'}")
    print("| shape | variant | regs | alone us | after qxe us | out = s12's |\n| --- | --- | ---: | ---: | ---: | --- |")
    for r in rows_out:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} | {r[4]:.2f} | {r[5]} |")


if __name__ == "__main__":
    main()
