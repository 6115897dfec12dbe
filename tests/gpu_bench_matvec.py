"""GPU only (not collected by pytest): bandwidth of the decode matvec kernels on full-size shapes.

    source scripts/device_setup.sh; python3 tests/gpu_bench_matvec.py [--budget-s 90]

Times every kernel inside a captured CUDA graph (a Python launch costs more than these kernels take),
rotating through enough copies of the weight that the L2 cannot serve them, and measures the device
copy bandwidth in the same run. GB/s = weight bytes / time. Writes matvec_bench.json under $OUT and
prints a table last. Sweeps (rows per CTA, prefetch) for n=1 to pick matvec_cuda.CONFIG.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_blocks import random_blocks  # noqa: E402

from lite.kernels import matvec_basic as mb, matvec_cuda as mc, quant_info  # noqa: E402
from lite.kernels.util import numba_stream  # noqa: E402

SHAPES = [(4096, 14336), (14336, 4096)]
TYPES = ["Q4_K", "Q6_K", "Q4_0", "Q8_0", "Q5_K"]
VARIANTS = [(4, 0), (8, 0), (4, 1), (8, 1), (16, 0)]   # (rows a CTA, prefetch)
L2_ROTATE_BYTES = 256 << 20      # the H200's L2 is 50 MB

stream = cp.cuda.Stream(non_blocking=True)


def gtime(fns, reps=10, replays=5):
    """Seconds per call of each fn, from replays of a graph capturing reps rounds of all fns."""
    with stream:
        for f in fns:
            f()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(reps):
            for f in fns:
                f()
        g = stream.end_capture()
        g.launch(stream)
        stream.synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        for _ in range(replays):
            g.launch(stream)
        e1.record(stream)
        e1.synchronize()
    return cp.cuda.get_elapsed_time(e0, e1) / 1e3 / (replays * reps * len(fns))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=100.0, help="stop starting new types after this")
    ap.add_argument("--numba", action="store_true", help="also time the Numba kernels (n=1)")
    args = ap.parse_args()
    out_dir = os.environ.get("OUT", "/tmp")
    t_start = time.time()
    a = cp.empty(512 << 20, cp.uint8)
    b = cp.empty_like(a)
    copy_el = 2 * a.nbytes / gtime([lambda: b.__setitem__(slice(None), a)], reps=5) / 1e9
    copy_mc = 2 * a.nbytes / gtime([lambda: cp.cuda.runtime.memcpyAsync(
        b.data.ptr, a.data.ptr, a.nbytes, cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr)], reps=5) / 1e9
    copy_bw = max(copy_el, copy_mc)
    del a, b
    print(f"device copy read+write: elementwise {copy_el:.0f} GB/s, cudaMemcpyAsync {copy_mc:.0f} GB/s; "
          f"using {copy_bw:.0f}", flush=True)
    res = {"copy_GBs": copy_bw, "config": {k: list(v) for k, v in mc.CONFIG.items()}, "rows": []}
    rng = np.random.default_rng(0)
    dev = cp.cuda.runtime.getDevice()
    for qt in TYPES:
        if time.time() - t_start > args.budget_s:
            print(f"budget spent: skipping {qt}", flush=True)
            continue
        info = quant_info(qt)
        for rows, cols in SHAPES:
            host = random_blocks(qt, rows * cols // info.block_elems, rng)
            nbytes = host.size
            copies = [cp.asarray(host) for _ in range(max(2, math.ceil(L2_ROTATE_BYTES / nbytes)))]
            x = cp.asarray(rng.standard_normal((8, cols)).astype(np.float32))
            runs = [("cuda", mc.CONFIG[qt], n) for n in (1, 2, 4, 8)]
            runs += [("cuda", v, 1) for v in VARIANTS if v != mc.CONFIG[qt]]
            if args.numba:
                runs.append(("numba", None, 1))
            ref = None
            for impl, cfg, n in runs:
                out = cp.empty((n, rows), cp.float32)
                xs = x[:n]
                if impl == "cuda":
                    if n == 1 and cfg != mc.CONFIG[qt]:   # variants: compile n=1 only
                        k = mc.raw_module(dev, qt, cfg, (1,)).get_function(mc.kernel_name(qt, 1, *cfg))
                        grid = ((rows + cfg[0] - 1) // cfg[0],)
                        fns = [lambda w=w: k(grid, (mc.THREADS,), (w, xs, out, np.int32(rows), np.int32(cols)))
                               for w in copies]
                    else:
                        fns = [lambda w=w: mc.launch(qt, w, xs, out, rows, cols, stream) for w in copies]
                else:
                    kern = mb._kernel(qt, n)
                    grid = math.ceil(rows / mb.ROWS)
                    views = [(mb.as_words(w), mb.as_words(w).view(np.float16)) for w in copies]
                    fns = [lambda v=v: kern[grid, 32 * mb.WARPS, numba_stream(stream)](v[0], v[1], xs, out, rows, cols)
                           for v in views]
                try:
                    t = gtime(fns)
                except Exception as e:   # report and go on: one failing variant must not hide the rest
                    print(f"FAIL {qt} {rows}x{cols} {impl} {cfg} n={n}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                # the last launch wrote `out` for the last copy: compare implementations on it
                diff = None
                if n == 1:
                    got = out.get().astype(np.float64)
                    if ref is None:
                        ref = got
                    diff = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
                gbs = nbytes / t / 1e9
                row = dict(type=qt, rows=rows, cols=cols, impl=impl, cfg=cfg, n=n, us=t * 1e6, GBs=gbs,
                           pct=100 * gbs / copy_bw, copies=len(copies), rel_diff_vs_default=diff)
                res["rows"].append(row)
                print(f"{qt:5s} {rows:5d}x{cols:5d} {impl:5s} {str(cfg):7s} n={n}: {t * 1e6:7.1f} us "
                      f"{gbs:6.0f} GB/s {row['pct']:5.1f}%  diff={diff}", flush=True)
            del copies
            json.dump(res, open(os.path.join(out_dir, "matvec_bench.json"), "w"), indent=1)
    print(f"\nweight bytes / time, % of the {copy_bw:.0f} GB/s device copy measured in this run")
    print("type  shape        impl  cfg      n1        n2        n4        n8")
    keys = {}
    for r in res["rows"]:
        if r["impl"] == "numba" or tuple(r["cfg"]) == tuple(mc.CONFIG[r["type"]]):
            keys.setdefault((r["type"], r["rows"], r["cols"], r["impl"]), {})[r["n"]] = r
    for (qt, rows, cols, impl), d in keys.items():
        cells = "".join(f"{d[n]['GBs']:5.0f}/{d[n]['pct']:2.0f}% " if n in d else " " * 10 for n in (1, 2, 4, 8))
        print(f"{qt:5s} {rows}x{cols:<6d} {impl:5s} {str(mc.CONFIG[qt] if impl == 'cuda' else '-'):8s} {cells}")
    best = {}
    for r in res["rows"]:
        if r["impl"] == "cuda" and r["n"] == 1:
            best.setdefault(r["type"], {}).setdefault(tuple(r["cfg"]), []).append(r["GBs"])
    for qt, d in best.items():
        print(qt, "n=1 mean GB/s over shapes by (rows/CTA, prefetch):",
              {k: round(sum(v) / len(v)) for k, v in sorted(d.items())})


if __name__ == "__main__":
    main()
