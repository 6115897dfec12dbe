"""Prefill attention of one layer alone, flash kernel against the materialized path (GPU machine).

The 8B shape (H 32, Hkv 8, D 128), one chunk of T queries that ends at each context length given:
    python3 scripts/bench_flash_attn.py [--T 2048] [--ctx 8192,32768] [--reps 5]
Prints ms per layer for each path (CUDA events around the calls, after a warm-up) and the largest
difference between the two outputs. The flash kernel is timed at each tile in --tiles (query rows
a CTA : CTAs an SM, the register cap), e.g. 64:2,128:1.
"""
import argparse
import types

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--ctx", default="8192,32768")
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--Hkv", type=int, default=8)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiles", default="64:2,128:1,64:3")
    a = ap.parse_args()
    import cupy as cp
    import lite.backends.cuda as cb
    from lite.kernels import cupy_ops
    from lite.kernels.flash_attn import flash_prefill

    stream = cp.cuda.Stream(non_blocking=True)
    # the backend's attention() needs only these attributes for a prefill chunk
    backend = types.SimpleNamespace(cp=cp, k=cupy_ops, stream=stream)
    scale = 1 / np.sqrt(a.D)

    def timed(fn):
        fn()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(a.reps):
            out = fn()
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / a.reps, out

    for ctx in (int(c) for c in a.ctx.split(",")):
        pos0 = ctx - a.T
        rng = cp.random.default_rng(1)
        K = (rng.standard_normal((a.Hkv, ctx, a.D), np.float32) * 0.5).astype(np.float16)
        V = rng.standard_normal((a.Hkv, ctx, a.D), np.float32).astype(np.float16)
        q = rng.standard_normal((a.T, a.H, a.D), np.float32)
        kv = types.SimpleNamespace(kind="f16", k={0: K}, v={0: V}, write=lambda *args: None)
        with stream:
            cb.FLASH_ATTN = False
            ms_mat, ref = timed(lambda: cb.CUDABackend.attention(backend, kv, 0, q, None, None,
                                                                 pos0, scale))
            line = f"T {a.T} ctx {ctx}: materialized {ms_mat:.2f} ms"
            for tile in a.tiles.split(","):
                bm, mc = (int(x) for x in tile.split(":"))
                ms, out = timed(lambda: flash_prefill(q, K, V, pos0, 0, scale, stream, bm=bm,
                                                      min_ctas=mc))
                diff = float(cp.abs(out.reshape(a.T, -1) - ref).max())
                flops = 4 * a.H * a.D * a.T * (pos0 + (a.T + 1) / 2)      # causal: QK and PV
                line += (f" | flash {bm}:{mc} {ms:.2f} ms, {flops / ms / 1e9:.0f} TFLOP/s,"
                         f" max |diff| {diff:.1e}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
