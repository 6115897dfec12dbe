"""Order dependence of decode attention: each variant alone, after an S_max 768 int8 call, at
S_max 32768 f16 pos 0/7/512, with the memory pool's free blocks poisoned with NaN first (so an
output the kernel never writes cannot pass by holding an earlier launch's result)."""
import sys
import numpy as np
import cupy as cp
sys.path.insert(0, "tests")
from test_cuda_decode import _cache_8b                             # noqa: E402
from test_cupy_kernels_emulated import decode_attention_reference  # noqa: E402
from lite.kernels import cupy_decode                               # noqa: E402


def run(variant, host, pos, counters, stream):
    dev = [None if a is None else cp.asarray(a) for a in host]
    # the copies ran on the legacy default stream, which a non-blocking stream does not wait
    # for: without this the kernels may read the cache before it has landed
    cp.cuda.runtime.deviceSynchronize()
    junk = [cp.full(n, np.nan, np.float32) for n in (4096, 4096 * 33 * 4, 33 * 4 * 8, 8 * 49 * 4 * 128)]
    del junk
    out = cupy_decode.attn_decode(*dev, cp.asarray([pos], np.int64), 0.088, 0, counters, stream,
                                  variant=variant)
    got = cp.asnumpy(out, stream=stream)
    stream.synchronize()
    want = decode_attention_reference(*host, pos, 0.088, 0)
    err = np.abs(got - want) / (np.abs(want) + 1e-3 * np.abs(want).max())
    return f"{err.max():.1e} (nan {np.isnan(got).sum()}) counters {cp.asnumpy(counters).tolist()[:8]}"


variant = sys.argv[1]
stream = cp.cuda.Stream(non_blocking=True)
counters = cupy_decode.new_counters()
small, big = _cache_8b("int8", 768, seed=1), _cache_8b("f16", 32768, seed=1)
for label, host, pos in (("f16 32768", big, 0), ("int8 768", small, 7), ("f16 32768", big, 0),
                         ("f16 32768", big, 7), ("f16 32768", big, 512)):
    print(variant, label, "pos", pos, run(variant, host, pos, counters, stream), flush=True)
