"""Decode-step attention as CuPy RawKernels: RoPE + KV-cache store in one launch, then attention
with its split merge in the same launch (CUDA C in kernels/cupy_decode_src.py).

Two launches a layer instead of six (rope q, rope k, store k, store v, attend, combine): in a
captured decode graph each launch costs ~2 us of ramp and tail besides its work. Every wrapper
takes the CuPy stream to launch on, reads the position from pos_dev and never synchronizes.
"""
import functools

import cupy as cp
import numpy as np

from lite.kernels.cupy_decode_src import DECODE_SRC

HEADS_PER_BLOCK = 4        # DEC_GB in the CUDA source
MAX_SPLITS = 64            # DEC_MAX_SPLITS: the grid's splits per KV head (fixed by S_max)
MIN_KEYS_PER_SPLIT = 64    # fewer keys a split would cost more in the merge than they save
THREADS = 128              # DEC_THREADS
MAX_KEY_DIM = 256          # DEC_MAX_D
MAX_ROW = 1024             # DEC_MAX_ROW
ROPE_THREADS = 64          # DEC_ROPE_THREADS
_module = None


def _kernel(name):
    global _module
    if _module is None:
        _module = cp.RawModule(code="#include <cuda_fp16.h>\n" + DECODE_SRC, options=("--std=c++17",))
    return _module.get_function(name)


def check_dims(D, Dv):
    """Raise if the kernels cannot serve these head dims."""
    if D % 8 or D > MAX_KEY_DIM or Dv % 8 or Dv // 8 > THREADS:
        raise ValueError(f"decode attention needs head dims that are multiples of 8, keys at most "
                         f"{MAX_KEY_DIM} and values at most {8 * THREADS}, got {D}/{Dv}")


def rope_kv_store(q, k, v, K, V, ks, vs, pos_dev, rope, stream):
    """One token: q (H, D) rotated into a new array (returned); k (Hkv, D) rotated and v (Hkv, Dv)
    stored into the caches K (Hkv, S_max, D), V (Hkv, S_max, Dv) at *pos_dev (f16, or int8 with
    per-row scales ks, vs (Hkv, S_max)). rope: (n_rot, base, freq_scale, neox), or None."""
    H, D = q.shape
    Hkv, S_max, Dv = V.shape
    if max(D, Dv) > MAX_ROW:
        raise ValueError(f"head dims above {MAX_ROW}: {D}/{Dv}")
    n_rot, base, freq_scale, neox = rope or (0, 1.0, 1.0, False)
    q_out = cp.empty_like(q)
    dims = (pos_dev, np.int32(H), np.int32(Hkv), np.int32(D), np.int32(Dv), np.int32(S_max),
            np.int32(n_rot), np.float64(base), np.float64(freq_scale), np.int32(bool(neox)))
    grid, block = (H + 2 * Hkv,), (ROPE_THREADS,)
    if ks is None:
        _kernel("rope_kv_store_f16")(grid, block, (q, k, v, q_out, K, V) + dims, stream=stream)
    else:
        _kernel("rope_kv_store_i8")(grid, block, (q, k, v, q_out, K, V, ks, vs) + dims, stream=stream)
    return q_out


@functools.lru_cache(maxsize=None)
def _resident_blocks(device_id):
    """Blocks of attn_decode the GPU holds at once: its __launch_bounds__ keep it at 168 registers
    a thread, room for three 128-thread blocks an SM (ptxas, sm_90). More splits than that would
    run a second, mostly idle wave at long contexts."""
    return 3 * cp.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"]


def _current_resident_blocks():
    try:
        return _resident_blocks(cp.cuda.Device().id)
    except AttributeError:       # no device API (the host emulation in the tests)
        return 3 * 132


def grid_shape(H, Hkv, S_max):
    """(block columns, splits): a column is a KV head and a group of its query heads."""
    G = H // Hkv
    cols = Hkv * -(-G // HEADS_PER_BLOCK)
    splits = min(MAX_SPLITS, max(1, _current_resident_blocks() // cols),
                 -(-S_max // MIN_KEYS_PER_SPLIT))
    return cols, splits


def new_counters(n=4096):
    """The merge counters attn_decode needs: zeros, kept (every launch leaves them zero again)."""
    return cp.zeros(n, np.int32)


def attn_decode(q, K, V, ks, vs, pos_dev, scale, window, counters, stream):
    """q (H, D) f32 against cache K (Hkv, S_max, D), V (Hkv, S_max, Dv) up to *pos_dev -> (H, Dv).
    counters: from new_counters(), at least one per block column; launches on one stream may
    share them (each launch hands them back zeroed)."""
    H, D = q.shape
    Hkv, S_max, Dv = V.shape
    check_dims(D, Dv)
    cols, ns = grid_shape(H, Hkv, S_max)
    if counters.size < cols:
        raise ValueError(f"attn_decode needs {cols} counters, got {counters.size}")
    pm = cp.empty((cols, ns, HEADS_PER_BLOCK), np.float32)
    pl = cp.empty((cols, ns, HEADS_PER_BLOCK), np.float32)
    pacc = cp.empty((cols, ns, HEADS_PER_BLOCK, Dv), np.float32)
    out = cp.empty((H, Dv), np.float32)
    common = (pm, pl, pacc, counters, out, pos_dev, np.int32(H), np.int32(Hkv), np.int32(D),
              np.int32(Dv), np.int32(S_max), np.float32(scale), np.int32(window),
              np.int32(MIN_KEYS_PER_SPLIT))
    grid, block = (cols, ns), (THREADS,)
    if ks is None:
        _kernel("attn_decode_f16")(grid, block, (q, K, V) + common, stream=stream)
    else:
        _kernel("attn_decode_i8")(grid, block, (q, K, V, ks, vs) + common, stream=stream)
    return out
