"""Session 16: where a product's period goes, per form, at 4096x14336 after qxe (and alone: the x records given): each
CTA's globaltimer at entry, tables filled (and, LT_MVB_PREDECODE, its first block decoded), past the PDL wait,
products done, exit (LT_MVB_STAMPS, kernels/matvec_mma_src.py), over 40 launches in a captured graph, the median
over launches 5-38; beside each form its graph time alone and after qxe (median of 7 replays of 40 launches).
Forms: mvb<8, 1, 1, 0> (config's), with LT_MVB_PREDECODE, and SG = 1 (the odd chunks' signs by an add: session
14 measured it 14% slower at 8 warps after qxe, even under Nsight; not understood).

    python3 scripts/session16/timeline16.py
"""
import statistics

import cupy as cp
import numpy as np

from lite.kernels import iq3_b16, matvec_mma, matvec_q8, pdl

ROWS, COLS, LAUNCHES = 4096, 14336, 40
# Call 5 ran the predecode as the define LT_MVB_PREDECODE (commit "mvb: LT_MVB_PREDECODE ..."); since then it is mvb's
# template parameter D (the cfg's fifth).
FORMS = [("(8,1,1,0)", (8, 1, 1, 0, 0), ""), ("(8,1,1,0) predecode", (8, 1, 1, 0, 1), ""),
         ("(8,1,1,1)", (8, 1, 1, 1, 0), ""), ("(8,1,1,1) predecode", (8, 1, 1, 1, 1), "")]


def setup():
    rng = cp.random.default_rng(0)
    blocks = rng.integers(0, 256, ROWS * COLS // 256 * 98, dtype=np.uint8)
    blocks.reshape(-1, 98)[:, 0:2] = cp.asarray(np.array([0x3C00], np.uint16).view(np.uint8))   # d = 1
    first = iq3_b16.repack(blocks, ROWS, COLS)
    recs = [first] + [first.copy() for _ in range(-(-(256 << 20) // first.nbytes) - 1)]
    return recs, cp.asarray(np.random.default_rng(1).standard_normal((1, COLS)).astype(np.float32))


def functions(cfg, stamps, extra):
    names = (matvec_mma.QUANTIZER, matvec_mma.kernel_name(*cfg))
    mod = matvec_mma._module(cp.cuda.runtime.getDevice(), names, matvec_mma.module_head(stamps, extra))
    mv = mod.get_function(names[1])
    if mv.max_dynamic_shared_size_bytes < matvec_mma.ALIGN_DYN:
        mv.max_dynamic_shared_size_bytes = matvec_mma.ALIGN_DYN
    return mod, mod.get_function(names[0]), mv


def graph(run, s):
    with s:
        run(0, True)
        s.synchronize()
        s.begin_capture()
        for i in range(LAUNCHES):
            run(i, True)
        return s.end_capture()


def main():
    recs, x = setup()
    xq, s = cp.empty_like(x), cp.cuda.Stream(non_blocking=True)
    rows = []
    for name, cfg, extra in FORMS:
        res = {}
        for stamps in (False, True):
            mod, quant, mv = functions(cfg, stamps, extra)
            out = cp.empty((1, ROWS), cp.float32)

            def run(i, with_q, quant=quant, mv=mv, out=out):
                if with_q:
                    pdl.call(quant, matvec_q8.quantize_grid(1, COLS), (128,), (x, xq, np.int32(COLS)))
                pdl.call(mv, (ROWS // 16,), (32 * cfg[0],), (recs[i % len(recs)], xq, out, np.int32(ROWS),
                                                           np.int32(COLS)), shared_mem=matvec_mma.ALIGN_DYN)
            if not stamps:
                for with_q in (False, True):
                    with s:
                        run(0, True)
                        s.synchronize()
                        s.begin_capture()
                        for i in range(LAUNCHES):
                            run(i, with_q)
                        g = s.end_capture()
                    ts = []
                    for _ in range(7):
                        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                        e0.record(s)
                        g.launch(s)
                        e1.record(s)
                        e1.synchronize()
                        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1000 / LAUNCHES)
                    res["after qxe" if with_q else "alone"] = statistics.median(ts)
                continue
            count = cp.ndarray((4096,), cp.uint32, memptr=mod.get_global("lt_mvb_count"))
            g = graph(run, s)
            with s:
                g.launch(s)
                s.synchronize()
                count.fill(0)
                g.launch(s)
                s.synchronize()
            st = cp.ndarray((64, 4096, 8), cp.uint64, memptr=mod.get_global("lt_mvb_stamps"))[:LAUNCHES, :ROWS // 16, :5]
            us = (st.get().astype(np.int64) - int(st[:, :, 0].min())) / 1000.0
            keys = {"period": lambda n, e: us[n + 1][:, 2].min() - e[:, 2].min(),
                    "release": lambda n, e: e[:, 2].min() - us[n - 1][:, 4].max(),
                    "fill med": lambda n, e: float(np.median(e[:, 1] - e[:, 0])),
                    "filled->release med": lambda n, e: float(np.median(e[:, 2].min() - e[:, 1])),
                    "compute med": lambda n, e: float(np.median(e[:, 3] - e[:, 2])),
                    "compute max": lambda n, e: float((e[:, 3] - e[:, 2]).max()),
                    "done->exit med": lambda n, e: float(np.median(e[:, 4] - e[:, 3]))}
            for k, f in keys.items():
                res[k] = statistics.median(f(n, us[n]) for n in range(5, LAUNCHES - 1))
        rows.append((name, res))
        print(name, {k: round(v, 2) for k, v in res.items()}, flush=True)
    keys = list(rows[0][1])
    print("\n| form | " + " | ".join(keys) + " |\n| --- |" + " ---: |" * len(keys))
    for name, res in rows:
        print(f"| {name} | " + " | ".join(f"{res[k]:.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
