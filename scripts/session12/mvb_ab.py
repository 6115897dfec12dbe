"""Session 12: kernels/matvec_mma.py's mvb timed alone and after qx, by (warps, prefetch), at the three
shapes of the kernel table (captured graphs, weights rotated past the L2, as lite.kernels.bench)."""
import statistics

import cupy as cp
import numpy as np

from lite.kernels import matvec_mma, matvec_q8, pdl


def time_graph(fn, launches=40, repeats=7):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        fn(0)
        s.synchronize()
        s.begin_capture()
        for i in range(launches):
            fn(i)
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


def main():
    dev = cp.cuda.runtime.getDevice()
    for rows, cols in ((4096, 14336), (14336, 4096), (4096, 4096)):
        rng = cp.random.default_rng(0)
        blocks = rng.integers(0, 256, rows * cols // 256 * 98, dtype=np.uint8)
        blocks.reshape(-1, 98)[:, 0:2] = cp.asarray(np.array([0x3C00], np.uint16).view(np.uint8))   # d = 1
        recs = [matvec_mma.repack(blocks, rows, cols) for _ in range(4)]
        x = cp.asarray(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32))
        out = cp.empty((1, rows), cp.float32)
        line = [f"{rows}x{cols}"]
        line.append(f"launch() {time_graph(lambda i: matvec_mma.launch(recs[i % 4], x, out, rows, cols)):.2f}")
        from lite.kernels import iq3_groups
        g4 = [iq3_groups.repack(blocks, rows, cols) for _ in range(4)]
        q4, mv4 = matvec_q8.functions(dev, "IQ3_XXS_G4", 1, 4, 2)
        xq4 = cp.empty_like(x)
        qg = matvec_q8.quantize_grid(1, cols)
        args = lambda i: (g4[i % 4], xq4, out, np.int32(rows), np.int32(cols))
        line.append(f"qx alone {time_graph(lambda i: pdl.call(q4, qg, (128,), (x, xq4, np.int32(cols)))):.2f}")
        line.append(f"qx+mv_iq2 {time_graph(lambda i: (pdl.call(q4, qg, (128,), (x, xq4, np.int32(cols))), pdl.call(mv4, (rows // 4,), (128,), args(i)))):.2f}")
        line.append(f"mv_iq2 {time_graph(lambda i: pdl.call(mv4, (rows // 4,), (128,), args(i))):.2f}")
        for w, p, qn in ((8, 1, "qxe"), (8, 2, "qxe"), (8, 3, "qxe"), (4, 1, "qxe"), (4, 2, "qxe"), (4, 3, "qxe")):
            names = (matvec_q8.quantize_name("IQ3_XXS").replace("qx<", qn + "<"), matvec_mma.kernel_name(w, p))
            mod = matvec_mma._module(dev, names, pdl.source_head())
            quant, mv = mod.get_function(names[0]), mod.get_function(names[1])
            xq = cp.empty_like(x)
            pdl.call(quant, matvec_q8.quantize_grid(1, cols), (128,), (x, xq, np.int32(cols)))
            grid = (rows // 16,)   # (session 12 calls 13-15: min(bands, 264), the persistent form)
            t = time_graph(lambda i: pdl.call(mv, grid, (32 * w,), (recs[i % 4], xq, out, np.int32(rows), np.int32(cols))))
            if qn == "qx":
                line.append(f"mvb<{w},{p}> {t:.2f} ({mv.num_regs} regs)")
            t = time_graph(lambda i: (pdl.call(quant, matvec_q8.quantize_grid(1, cols), (128,), (x, xq, np.int32(cols))),
                                      pdl.call(mv, grid, (32 * w,), (recs[i % 4], xq, out, np.int32(rows), np.int32(cols)))))
            line.append(f"{qn}+mvb<{w},{p}> {t:.2f}")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
