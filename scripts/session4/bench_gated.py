"""Session 4: the gated gate/up product (kernels/matvec_epilogue.py) against the plain product of
the same 2F x n_embd rows, with [gate; up] as two halves and interleaved (call 6 of session 4 ran
it with rows in pairs: gate u, u+1, up u, u+1; now gate u, up u, ...), with and without the norm's
scale-in, in captured graphs over rotating weight copies (tests/gpu_bench_matvec.gtime).
On the device: source scripts/device_setup.sh; python3 scripts/session4/bench_gated.py"""
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from gpu_bench_matvec import gtime  # noqa: E402
from kernel_blocks import random_blocks  # noqa: E402

from lite.kernels import matvec_cuda as mc, matvec_epilogue as me, quant_info  # noqa: E402

F, C, COPIES = 14336, 4096, 4
rng = np.random.default_rng(0)
print(f"{'type':6s} {'variant':22s} {'us':>7s} {'GB/s':>6s}")
for qt in ("Q4_K", "Q6_K"):
    info = quant_info(qt)
    host = random_blocks(qt, 2 * F * C // info.block_elems, rng)
    ws = [cp.asarray(host) for _ in range(COPIES)]
    wil = [cp.asarray(host.reshape(2 * F, -1)[me.interleave_rows(F)].reshape(-1)) for _ in range(COPIES)]
    x = cp.asarray(rng.standard_normal((1, C)).astype(np.float32) * 0.01)
    scale = cp.asarray(np.array([0.7], np.float32))
    y2, y1 = cp.empty((1, 2 * F), cp.float32), cp.empty((1, F), cp.float32)
    ref = cp.empty((1, F), cp.float32)
    me.launch(qt, ws[0], x, ref, 2 * F, C, "silu")
    chk = cp.empty((1, F), cp.float32)
    me.launch(qt, wil[0], x, chk, 2 * F, C, "silu", interleaved=True)
    assert bool((chk == ref).all()), "interleaved != plain layout"
    variants = {
        "plain mv 2F rows": lambda w, _: mc.launch(qt, w, x, y2, 2 * F, C, None),
        "gated halves": lambda w, _: me.launch(qt, w, x, y1, 2 * F, C, "silu"),
        "gated interleaved": lambda _, w: me.launch(qt, w, x, y1, 2 * F, C, "silu", interleaved=True),
        "gated halves, scale": lambda w, _: me.launch(qt, w, x, y1, 2 * F, C, "silu", scale_in=scale),
        "gated interl., scale": lambda _, w: me.launch(qt, w, x, y1, 2 * F, C, "silu", scale_in=scale,
                                                       interleaved=True),
    }
    for name, f in variants.items():
        t = gtime([lambda i=i, f=f: f(ws[i], wil[i]) for i in range(COPIES)])
        print(f"{qt:6s} {name:22s} {t * 1e6:7.1f} {host.nbytes / t / 1e9:6.0f}", flush=True)
