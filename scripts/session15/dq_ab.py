"""Session 15, call 2: IQ3_XXS_B16's fp16 dequantize, session 14's dqb (8-byte stores straight to 8 rows a store;
scripts/session15/dequant_b16_s14.py, the file at commit 102331f: removed after the call, `git show
102331f:kernels/dequant_b16.py > scripts/session15/dequant_b16_s14.py` to run this again) against the staged one (kernels/dequant_b16.py:
a warp's record through shared memory, whole rows out), at the 8B file's shapes: outputs equal bit for bit, then
us and GB/s (GGUF bytes read + fp16 written) in captured graphs of 20 launches, the median of 7 replays.

    python3 scripts/session15/dq_ab.py
"""
import importlib.util
import statistics
from pathlib import Path

import cupy as cp
import numpy as np

from lite.kernels import dequant_b16

spec = importlib.util.spec_from_file_location("dq14", Path(__file__).resolve().parent / "dequant_b16_s14.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)


def time_graph(fn, launches=20, repeats=7):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        fn(s)
        s.synchronize()
        s.begin_capture()
        for _ in range(launches):
            fn(s)
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


print("| shape | s14 dqb us | GB/s | staged dqb us | GB/s | equal |")
print("| --- | ---: | ---: | ---: | ---: | --- |")
for rows, cols in ((4096, 14336), (28672, 4096), (4096, 4096), (6144, 4096)):
    rec = cp.random.default_rng(0).integers(0, 256, rows * cols // 256 * 102, dtype=np.uint8)
    rec.reshape(-1, 1632)[:, 1600:1632] = 0x3C     # finite d (the halves 0x3C3C) in every record
    a = cp.empty((rows, cols), np.float16)
    b = cp.empty((rows, cols), np.float16)
    old.dequantize(rec, rows, cols, np.float16, out=a)
    dequant_b16.dequantize(rec, rows, cols, np.float16, out=b)
    eq = bool(cp.array_equal(a.view(np.uint16), b.view(np.uint16)))
    nbytes = rows * cols // 256 * 98 + 2 * rows * cols
    t0 = time_graph(lambda s: old.dequantize(rec, rows, cols, np.float16, s, out=a))
    t1 = time_graph(lambda s: dequant_b16.dequantize(rec, rows, cols, np.float16, s, out=b))
    print(f"| {rows}x{cols} | {t0:.1f} | {nbytes / t0 / 1e3:,.0f} | {t1:.1f} | {nbytes / t1 / 1e3:,.0f} | {eq} |")
