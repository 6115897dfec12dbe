"""Which decode-attention variant is off at S_max 32768 (f16 and int8), against float64 NumPy."""
import sys
import numpy as np
import cupy as cp
sys.path.insert(0, "tests")
from test_cuda_decode import _cache_8b, _run                       # noqa: E402
from test_cupy_kernels_emulated import decode_attention_reference  # noqa: E402
from lite.kernels import cupy_decode                               # noqa: E402

POSITIONS = [int(p) for p in sys.argv[1].split(",")] if len(sys.argv) > 1 else (0, 511, 4000, 8191, 8447, 16000, 32000, 32767)
for kind in ("f16", "int8"):
    for S in ((8448, 32768) if len(sys.argv) < 3 else [int(sys.argv[2])]):
        host = _cache_8b(kind, S, seed=1)
        dev = [None if a is None else cp.asarray(a) for a in host]
        # the copies ran on the legacy default stream, which a non-blocking stream does not wait
        # for: without this the kernels may read the cache before it has landed
        cp.cuda.runtime.deviceSynchronize()
        counters = cupy_decode.new_counters()
        stream = cp.cuda.Stream(non_blocking=True)
        for pos in POSITIONS:
            if pos >= S:
                continue
            want = decode_attention_reference(*host, pos, 0.088, 0)
            row = []
            for v in ("v1", "v2"):
                got = _run(v, dev, pos, 0, counters, stream)
                err = np.abs(got - want) / (np.abs(want) + 1e-3 * np.abs(want).max())
                row.append(f"{v} max err {err.max():.1e} at {np.unravel_index(err.argmax(), err.shape)}")
            print(f"{kind} S {S} pos {pos}: " + "; ".join(row), flush=True)
