"""GPU time of the decode attention launches alone (8B llama head shape), without per-graph
launch overhead: 50 launches captured into one graph, replayed, timed with events.

    python3 scripts/bench_decode_attn.py
"""
import cupy as cp
import numpy as np

from lite.kernels import cupy_decode

H, HKV, D = 32, 8, 128
REPS = 50


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
    stream = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    with stream:
        for kind in ("f16", "int8"):
            for s_max, pos in ((768, 512), (8448, 8192), (32768, 32000)):
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
                t_attn = timed(stream, lambda: cupy_decode.attn_decode(
                    q, K, V, ks, vs, pos_dev, 0.088, 0, counters, stream))
                kv_bytes = 2 * HKV * (pos + 1) * D * K.itemsize
                print(f"{kind:4s} S_max {s_max:6d} pos {pos:6d}: rope_kv_store {t_store:6.1f} us, "
                      f"attn_decode {t_attn:6.1f} us ({kv_bytes / t_attn / 1e3:6.0f} GB/s of K+V), "
                      f"grid {cupy_decode.grid_shape(H, HKV, s_max)}")


if __name__ == "__main__":
    main()
