"""GPU time of the decode attention launches alone (8B llama head shape), without per-graph
launch overhead: 50 launches captured into one graph, replayed, timed with events.

    python3 scripts/bench_decode_attn.py                       # both variants
    python3 scripts/bench_decode_attn.py --variant v2 --v2-tune "" "warps=4,blocks_per_sm=4"

--v2-tune: settings of LITE_DECODE_ATTN_V2 to time one after another (kernels/cupy_decode.py, V2).
"""
import argparse
import os

import cupy as cp
import numpy as np

from lite.kernels import cupy_decode

H, HKV, D = 32, 8, 128
REPS = 50
# (S_max, position): short and long contexts, and a short one in a long cache (a decode graph
# captured for a long context: most splits of the grid exit at once)
CASES = ((768, 512), (8448, 8192), (32768, 32000), (32768, 512))


def timed(stream, fn):
    """Microseconds a call of fn() takes on the GPU, inside one captured graph of REPS calls."""
    fn()                                                     # compile, warm up
    stream.synchronize()
    stream.begin_capture()
    for _ in range(REPS):
        fn()
    graph = stream.end_capture()
    graph.launch(stream)
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record(stream)
    for _ in range(5):
        graph.launch(stream)
    b.record(stream)
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) * 1e3 / (5 * REPS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="v1,v2", help="comma-separated: v1, v2")
    ap.add_argument("--v2-tune", nargs="*", default=[""], help="LITE_DECODE_ATTN_V2 settings")
    ap.add_argument("--kinds", default="f16,int8")
    args = ap.parse_args()
    runs = [("v1", "")] if "v1" in args.variant.split(",") else []
    runs += [("v2", t) for t in args.v2_tune] if "v2" in args.variant.split(",") else []
    stream = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    with stream:
        for kind in args.kinds.split(","):
            for s_max, pos in CASES:
                if kind == "f16":
                    K = cp.asarray(rng.standard_normal((HKV, s_max, D)).astype(np.float16))
                    V = cp.asarray(rng.standard_normal((HKV, s_max, D)).astype(np.float16))
                    ks = vs = None
                else:
                    K = cp.asarray(rng.integers(-127, 128, (HKV, s_max, D)).astype(np.int8))
                    V = cp.asarray(rng.integers(-127, 128, (HKV, s_max, D)).astype(np.int8))
                    ks, vs = (cp.full((HKV, s_max), 0.01, np.float32) for _ in range(2))
                q = cp.asarray(rng.standard_normal((H, D)).astype(np.float32))
                k = cp.asarray(rng.standard_normal((HKV, D)).astype(np.float32))
                v = cp.asarray(rng.standard_normal((HKV, D)).astype(np.float32))
                pos_dev = cp.asarray([pos], np.int64)
                counters = cupy_decode.new_counters()
                t_store = timed(stream, lambda: cupy_decode.rope_kv_store(
                    q, k, v, K, V, ks, vs, pos_dev, (D, 500000.0, 1.0, False), stream))
                kv_bytes = 2 * HKV * (pos + 1) * D * K.itemsize
                print(f"{kind:4s} S_max {s_max:6d} pos {pos:6d}: rope_kv_store {t_store:6.1f} us")
                ref = None
                for variant, tune in runs:
                    os.environ["LITE_DECODE_ATTN_V2"] = tune
                    call = lambda: cupy_decode.attn_decode(                # noqa: E731
                        q, K, V, ks, vs, pos_dev, 0.088, 0, counters, stream, variant=variant)
                    t_attn = timed(stream, call)
                    out = cp.asnumpy(call(), stream=stream)
                    stream.synchronize()
                    ref = out if ref is None else ref
                    err = np.abs(out - ref).max() / np.abs(ref).max()
                    grid = (cupy_decode.grid_shape(H, HKV, s_max) if variant == "v1" else
                            cupy_decode.grid_shape_v2(H, HKV, s_max, D, D, ks is not None))
                    print(f"    {variant} {tune or 'default':28s} attn_decode {t_attn:6.1f} us "
                          f"({kv_bytes / t_attn / 1e3:6.0f} GB/s of K+V), grid {grid}, "
                          f"max rel diff to first {err:.1e}")
                os.environ.pop("LITE_DECODE_ATTN_V2", None)
                del K, V


if __name__ == "__main__":
    main()
