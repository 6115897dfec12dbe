"""Attention of one decode token for the head dims kernels/decode_attention.py's kernel lacks:
int8 rows that are no whole 16-byte pieces, key dims below 32, value dims above 256 (CUDA C in
kernels/cuda/decode_attention_tiled.cu).

The same contract as decode_attention.attention: position from the device, a grid fixed by the
cache size, the splits merged by the last block of a column. Its four warps walk tiles of keys
together (K loads, a block barrier, softmax, a barrier, V loads), which serves any head dims that
are multiples of 8 (keys up to MAX_KEY_DIM, values up to 8 * THREADS) but keeps one load round in
flight a block, so it is not the default.
"""
import functools

import cupy as cp
import numpy as np

from lite.kernels import pdl
from lite.kernels.cuda_source import source
from lite.kernels.pdl import call as _launch

HEADS_PER_BLOCK = 4        # DEC_GB in the CUDA source
MAX_SPLITS = 64            # DEC_MAX_SPLITS: the grid's splits per KV head (fixed by S_max)
MIN_KEYS_PER_SPLIT = 64    # fewer keys a split would cost more in the merge than they save
THREADS = 128              # DEC_THREADS
MAX_KEY_DIM = 256          # DEC_MAX_D
_modules = {}              # PDL on -> the module


def _kernel(name, use_pdl):
    if use_pdl not in _modules:
        code = ("#include <cuda_fp16.h>\n" + pdl.source_head(use_pdl)
                + source("decode_attention_tiled.cu"))
        _modules[use_pdl] = cp.RawModule(code=code, options=("--std=c++17",))
    return _modules[use_pdl].get_function(name)


def check_dims(D, Dv):
    """Raise if the kernel cannot serve these head dims."""
    if D % 8 or D > MAX_KEY_DIM or Dv % 8 or Dv // 8 > THREADS:
        raise ValueError(f"decode attention needs head dims that are multiples of 8, keys at most "
                         f"{MAX_KEY_DIM} and values at most {8 * THREADS}, got {D}/{Dv}")


@functools.lru_cache(maxsize=None)
def _resident_blocks(device_id):
    """Blocks the GPU holds at once: the kernel's __launch_bounds__ keep it at 168 registers a
    thread, room for three 128-thread blocks an SM (ptxas, sm_90). More splits than that would run
    a second, mostly idle wave at long contexts."""
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


def attention(q, K, V, ks, vs, pos_dev, scale, window, counters, stream, pdl=False):
    """decode_attention.attention's contract, on the tiled kernel."""
    H, D = q.shape
    Hkv, S_max, Dv = V.shape
    check_dims(D, Dv)
    cols, ns = grid_shape(H, Hkv, S_max)
    if counters.size < cols:
        raise ValueError(f"decode attention needs {cols} counters, got {counters.size}")
    pm = cp.empty((cols, ns, HEADS_PER_BLOCK), np.float32)
    pl = cp.empty((cols, ns, HEADS_PER_BLOCK), np.float32)
    pacc = cp.empty((cols, ns, HEADS_PER_BLOCK, Dv), np.float32)
    out = cp.empty((H, Dv), np.float32)
    common = (pm, pl, pacc, counters, out, pos_dev, np.int32(H), np.int32(Hkv), np.int32(D),
              np.int32(Dv), np.int32(S_max), np.float32(scale), np.int32(window),
              np.int32(MIN_KEYS_PER_SPLIT))
    if ks is None:
        fn, args = _kernel("decode_attention_tiled_f16", pdl), (q, K, V)
    else:
        fn, args = _kernel("decode_attention_tiled_i8", pdl), (q, K, V, ks, vs)
    _launch(fn, (cols, ns), (THREADS,), args + common, stream, pdl=pdl)
    return out
