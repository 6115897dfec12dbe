"""The chunked gated delta rule (prefill) on the tensor cores: CUDA C in kernels/cuda/delta_rule_mma.cu.

    if supports(dk, dv):
        out = chunked(q, k, v, g, beta, S, scale, stream)     # as kernels/delta_rule.chunked

Two launches: the per-chunk WY parts of every (chunk, value head) at once (the inverse in fp32, the
products on tf32 mma.sync, or 3xTF32 with split), then a block a (value head, column tile of S) over the chunks in order
(S fp32 in memory, its products on tf32 mma.sync). The same semantics as kernels/delta_rule.chunked,
to tf32's precision (tests/test_delta_rule_mma_emulated.py runs this C on the host against
lite/backends/cpu_recurrent.py). BackendConfig.delta_rule_mma selects it.
"""
import functools

import cupy as cp
import numpy as np

from lite.kernels.cuda_source import current_device, source
from lite.kernels.delta_rule import MAX_SHARED, _check, _f32

CHUNK = 64                 # DRM_BT
THREADS = 256              # a block's threads in both kernels
COLUMN_TILE = 32           # the most value columns of S a chunks block takes
_functions = {}            # (device, dk, dv, tile, split, name) -> the kernel


def column_tile(dv):
    return min(COLUMN_TILE, dv)


def prep_bytes(dk, dv):
    """The prep block's shared memory: K, Q, V, A, T (rows padded), the inverse's scratch, G, beta."""
    return 4 * (2 * CHUNK * (dk + 4) + CHUNK * (dv + 8) + 2 * CHUNK * (CHUNK + 4) + 16 * CHUNK + 2 * CHUNK)


def chunks_bytes(dk, tile):
    """The chunks block's shared memory: S's columns, Q, K, W, U, M (rows padded), G."""
    return 4 * (dk * (tile + 8) + 3 * CHUNK * (dk + 4) + CHUNK * (tile + 8) + CHUNK * (CHUNK + 4) + CHUNK)


def supports(dk, dv):
    """Head dims this kernel takes: multiples of 16 whose blocks fit the shared memory."""
    return (dk > 0 and dv > 0 and dk % 16 == 0 and dv % 16 == 0
            and max(prep_bytes(dk, dv), chunks_bytes(dk, column_tile(dv))) <= MAX_SHARED)


@functools.lru_cache(maxsize=None)
def _module(device, dk, dv, tile, split):
    smem = max(prep_bytes(dk, dv), chunks_bytes(dk, tile))
    defines = {"DRM_DK": dk, "DRM_DV": dv, "DRM_DVT": tile, "DRM_SPLIT": int(split), "DRM_SMEM": smem}
    return cp.RawModule(code=source("delta_rule_mma.cu", defines=defines), options=("--std=c++17",))


def _function(name, dk, dv, tile, split, smem):
    key = (current_device(cp), dk, dv, tile, split, name)
    if key not in _functions:
        fn = _module(key[0], dk, dv, tile, split).get_function(name)
        if smem > 48 * 1024:                        # above the default dynamic limit
            fn.max_dynamic_shared_size_bytes = smem
        _functions[key] = fn
    return _functions[key]


def chunked(q, k, v, g, beta, S, scale, stream, split=False):
    """T tokens: q, k (T, Hk, dk), v (T, Hv, dv), g, beta (T, Hv); S (Hv, dk, dv) updated in place
    -> out (T, Hv, dv). split: every product as three tf32 products of its inputs' high and low
    parts (3xTF32, about fp32's precision at three times the mma work). Scratch of about
    T Hv (dk + dv + 1 + CHUNK) floats for the call."""
    q, k, v, g, beta = (_f32(a) for a in (q, k, v, g, beta))
    T, Hk, dk, Hv, dv = _check(q, k, v, g, beta, S)
    if not supports(dk, dv):
        raise ValueError(f"delta rule mma: head dims {dk}, {dv} (multiples of 16 whose blocks fit "
                         f"{MAX_SHARED} bytes of shared memory)")
    tile = column_tile(dv)
    out = cp.empty((T, Hv, dv), np.float32)
    if not T:
        return out
    n_chunks = -(-T // CHUNK)
    W, U = cp.empty((T, Hv, dk), np.float32), cp.empty((T, Hv, dv), np.float32)
    G, M = cp.empty((T, Hv), np.float32), cp.empty((n_chunks, Hv, CHUNK, CHUNK), np.float32)
    smem = prep_bytes(dk, dv)
    _function("delta_rule_mma_prep", dk, dv, tile, split, smem)(
        (n_chunks, Hv), (THREADS,),
        (q, k, v, g, beta, W, U, G, M, np.int32(T), np.int32(Hk), np.int32(Hv), np.float32(scale)),
        stream=stream, shared_mem=smem)
    smem = chunks_bytes(dk, tile)
    _function("delta_rule_mma_chunks", dk, dv, tile, split, smem)(
        (Hv, -(-dv // tile)), (THREADS,),
        (q, k, W, U, G, M, S, out, np.int32(T), np.int32(Hk), np.int32(Hv), np.float32(scale)),
        stream=stream, shared_mem=smem)
    return out
