"""Session 15, call 8: the 8B FFN's two IQ3_XXS_B16 decode products as the decode step runs them, the gated [gate; up]
(28672x4096, silu, config's mvbe after qxe) then the down product (4096x14336, "add", qxe + mvb), against mvbp (the
gated product 2 bands a CTA, writing its output's x records) then the down product over those records (no quantizer
launch): each pair captured 40 times into a graph over weight copies rotated through 256 MB, the lower of two
medians of 7 replays; the down outputs must be equal bit for bit.

    python3 scripts/session15/gated_ab.py

mvbp lost (call 8: the pair 32.33 -> 33.44 us, the gated product alone 22.48 -> 24.19; 8B tg128 506 -> 491-495) and
was reverted: this script needs kernels/ and lite/ at commit fb49d98.
"""
import statistics

import cupy as cp
import numpy as np

from lite.kernels import iq3_b16, matvec_mma


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


def weights(rows, cols, seed):
    blocks = cp.random.default_rng(seed).integers(0, 256, rows * cols // 256 * 98, dtype=np.uint8)
    blocks.reshape(-1, 98)[:, 0:2] = cp.asarray(np.array([0x2C00], np.uint16).view(np.uint8))   # d = 1/16
    first = iq3_b16.repack(blocks, rows, cols)
    return [first] + [first.copy() for _ in range(-(-(128 << 20) // first.nbytes) - 1)]


F, D = 14336, 4096
gu, down = weights(2 * F, D, 0), weights(D, F, 1)
x = cp.asarray(np.random.default_rng(2).standard_normal((1, D)).astype(np.float32))
res = cp.asarray(np.random.default_rng(3).standard_normal((1, D)).astype(np.float32))
h, xr, y = cp.empty((1, F), cp.float32), cp.empty((1, F), cp.float32), cp.empty((1, D), cp.float32)


def ffn(i, s, records):
    matvec_mma.launch(gu[i % len(gu)], x, h, 2 * F, D, s, epilogue="silu", records_out=xr if records else None)
    matvec_mma.launch(down[i % len(down)], h, y, D, F, s, epilogue="add", res=res, x_records=xr if records else None)


outs, t = {}, {}
for _ in range(2):
    for records in (False, True):
        ffn(0, None, records)
        cp.cuda.runtime.deviceSynchronize()
        outs[records] = y.copy()
        t.setdefault(records, []).append(time_graph(lambda i, s, r=records: ffn(i, s, r)))
        t.setdefault(("gated", records), []).append(time_graph(
            lambda i, s, r=records: matvec_mma.launch(gu[i % len(gu)], x, h, 2 * F, D, s, epilogue="silu",
                                                      records_out=xr if r else None)))
print("| form | gated + down us | gated alone us |\n| --- | ---: | ---: |")
for records, label in ((False, "mvbe + qxe + mvb (today)"), (True, "mvbp with records + mvb over them")):
    print(f"| {label} | {min(t[records]):.2f} | {min(t[('gated', records)]):.2f} |")
print("down outputs equal:", bool(cp.array_equal(outs[False].view(cp.uint32), outs[True].view(cp.uint32))))
