"""When mvt's trips land and its teams compute (kernels/matvec_tma.py, D = 3): on the GPU, one
IQ3_XXS_G4 matrix (4096x14336 by default), qx then mvt<.., D = 3> a few times with programmatic
dependent launch (the last launch's stamps are read), then per event the spread over the CTAs'
teams of its time after the earliest CTA's entry, in microseconds.

Session 11 found mvt's whole (14.3 us alone) ~4.5 us above its compute alone (9.8) though its copies
alone take 7.0: this says whether the trips land late (all of them together near the end) or the
compute runs slower while they land.

    python3 scripts/mvt_timeline.py [rows cols] [--struct 'TIQ3_XXSG<1, 2>'] [--teams 8x4] [--no-qx]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kernel_blocks import random_blocks  # noqa: E402

EVENTS = ["entry", "past PDL wait", "trip 0 there", "trip 1 there", "trip 2 there", "trip 3 there", "copies issued",
          "compute done"]
ORDER = [0, 6, 1, 2, 3, 4, 5, 7]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="*", type=int, default=[4096, 14336])
    ap.add_argument("--struct", default="TIQ3_XXSG<1, 2>", help="e.g. 'TIQ3_XXSW<2>' (repack12's layout)")
    ap.add_argument("--teams", default="8x4", help="rows a team x teams (4 teams at most)")
    ap.add_argument("--no-qx", action="store_true", help="mvt after mvt, not after the quantizer")
    args = ap.parse_args()
    import cupy as cp
    from lite.kernels import iq3_groups, matvec_q8 as mq, pdl
    rows, cols = args.shape
    rr, tr = (int(v) for v in args.teams.split("x"))
    if tr > 4 or -(-(cols // 32) // 128) > 16:
        raise SystemExit("mvt_timeline: 4 teams at most, and rows of at most 16 trips (65536 columns)")
    name = f"mvt<{args.struct}, 1, {rr}, {tr}, 3, 0, TIQ3_XXS, 20>"
    qname = mq.quantize_name("IQ3_XXS")
    mod = mq._module(cp.cuda.runtime.getDevice(), "IQ3_XXS", (qname, name), pdl.source_head())
    quant, f = mod.get_function(qname), mod.get_function(name)
    host = random_blocks("IQ3_XXS", rows * cols // 256, np.random.default_rng(0))
    pack = iq3_groups.repack12 if "TIQ3_XXSW" in args.struct else iq3_groups.repack
    w = cp.asarray(pack(host, rows, cols))
    rb = iq3_groups.nbytes(1, cols)
    ctas = -(-rows // (rr * tr))
    smem = rr * tr * rb
    f.max_dynamic_shared_size_bytes = smem
    f.preferred_shared_memory_carveout = 100
    x = cp.asarray(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32))
    xq = cp.empty_like(x)
    out = cp.zeros(32 * ctas + rows, cp.float32)   # the stamps, then the product
    pdl.call(quant, mq.quantize_grid(*x.shape), (128,), (x, xq, np.int32(cols)))
    for _ in range(5):             # the last launch's stamps stay in out
        if not args.no_qx:
            pdl.call(quant, mq.quantize_grid(*x.shape), (128,), (x, xq, np.int32(cols)))
        pdl.call(f, (ctas,), (128 * tr,), (w, xq, out, np.int32(rows), np.int32(cols)), shared_mem=smem)
    cp.cuda.runtime.deviceSynchronize()
    st = out.get().view(np.uint32)[: 32 * ctas].reshape(ctas, 4, 8)[:, :tr].astype(np.int64)
    t0 = st[:, :, 0].min()
    rel = ((st - t0) % (1 << 32)) / 1e3       # us after the earliest entry (the timer's low word wraps)
    print(f"{name}, {rows}x{cols}, {ctas} CTAs, after {'mvt' if args.no_qx else 'qx'}: us after the first entry")
    print(f"{'event':>14s} {'min':>7s} {'median':>7s} {'max':>7s}")
    trips = -(-(cols // 32) // 128)
    for k in ORDER:
        ev = EVENTS[k]
        if 2 <= k < 6 and k - 2 >= trips:
            continue
        v = rel[:, :, k].ravel()
        print(f"{ev:>14s} {v.min():7.2f} {np.median(v):7.2f} {v.max():7.2f}")


if __name__ == "__main__":
    main()
