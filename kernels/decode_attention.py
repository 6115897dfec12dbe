"""Attention of one decode token: RoPE + KV-cache store in one launch, then attention with its
split merge in the same launch (CUDA C in kernels/cuda/rope_kv_store.cu and decode_attention.cu).

Two launches a layer instead of six (rope q, rope k, store k, store v, attend, combine): in a
captured decode graph every launch costs ramp and tail besides its work. Every wrapper takes the
CuPy stream to launch on, reads the position from pos_dev (a captured graph replays any position)
and never synchronizes; pdl=True launches with programmatic dependencies (kernels/pdl.py).

The attention kernel gives every warp its own cp.async stream of 8-key stages (decode_attention.cu
says how). It copies whole 16-byte pieces of rows and is compiled for key dims 32..256: other head
dims (int8 rows that are no whole pieces, key dims below 32, value dims above 256) take the tiled
kernel (tiled_attention below, CUDA C in kernels/cuda/decode_attention_tiled.cu), which has the same
contract.
"""
import functools
from collections import namedtuple

import cupy as cp
import numpy as np

from lite.kernels import pdl
from lite.kernels.cuda_source import current_device, source
from lite.kernels.pdl import call as _launch

HEADS_PER_BLOCK = 4        # DA_GB: query heads a block column serves
MAX_SPLITS = 128           # DA_MAX_SPLITS
KEYS_A_STAGE = 8           # DA_KW
# The block shape: warps a block; bytes of cp.async ring a warp (stages = WARP_BYTES // bytes of an
# 8-key stage, 2..8); blocks an SM the register cap (__launch_bounds__) is set for.
WARPS = 8
WARP_BYTES = 12288
BLOCKS_PER_SM = 2
ROPE_MAX_ROW = 1024        # DEC_MAX_ROW
ROPE_THREADS = 64          # DEC_ROPE_THREADS

# What the kernel is compiled for: warps a block (DA_NW), stages a warp's ring holds, dynamic
# shared bytes, blocks an SM (DA_MIN_BLOCKS) and the fewest keys a split takes.
Shape = namedtuple("Shape", "warps stages shared_bytes blocks_per_sm min_keys")
_functions = {}            # (device, file, defines, PDL on, name) -> the kernel


def module_source(name, use_pdl, defines=None):
    """The text NVRTC compiles for kernels/cuda/<name>."""
    return "#include <cuda_fp16.h>\n" + pdl.source_head(use_pdl) + source(name, defines=defines)


@functools.lru_cache(maxsize=None)
def _module(file, defines, use_pdl):
    return cp.RawModule(code=module_source(file, use_pdl, dict(defines)), options=("--std=c++17",))


def _function(file, name, use_pdl, defines=None, configure=None):
    """The kernel `name` of kernels/cuda/<file> on the current device; configure(kernel) runs once
    a device."""
    defines = tuple((defines or {}).items())
    key = (current_device(cp), file, defines, use_pdl, name)
    if key not in _functions:
        fn = _module(file, defines, use_pdl).get_function(name)
        if configure is not None:
            configure(fn)
        _functions[key] = fn
    return _functions[key]


def new_counters(n=4096):
    """The merge counters attention needs: zeros, kept (every launch leaves them zero again)."""
    return cp.zeros(n, np.int32)


def rope_kv_store(q, k, v, K, V, ks, vs, pos_dev, rope, stream, norm=None, pdl=False):
    """One token: q (H, D) rotated into a new array (returned); k (Hkv, D) rotated and v (Hkv, Dv)
    stored into the caches K (Hkv, S_max, D), V (Hkv, S_max, Dv) at *pos_dev (f16, or int8 with
    per-row scales ks, vs (Hkv, S_max)). rope: (n_rot, base, freq_scale, neox), or None.
    norm: (q weights or None, k weights or None, eps), or None: each q and k head RMS-normed with
    its (D,) f32 weights before the rotation (qwen3's per-head QK norm; the sums in the order of
    small_ops.rms_norm)."""
    H, D = q.shape
    Hkv, S_max, Dv = V.shape
    if max(D, Dv) > ROPE_MAX_ROW:
        raise ValueError(f"head dims above {ROPE_MAX_ROW}: {D}/{Dv}")
    n_rot, base, freq_scale, neox = rope or (0, 1.0, 1.0, False)
    qn, kn, eps = norm or (None, None, 0.0)
    for w in (qn, kn):
        if w is not None and w.shape != (D,):
            raise ValueError(f"norm weights of shape {w.shape} for head dim {D}")
    null = np.uint64(0)
    q_out = cp.empty_like(q)
    dims = (pos_dev, np.int32(H), np.int32(Hkv), np.int32(D), np.int32(Dv), np.int32(S_max),
            np.int32(n_rot), np.float64(base), np.float64(freq_scale), np.int32(bool(neox)),
            null if qn is None else qn, null if kn is None else kn, np.float32(eps))
    grid, block = (H + 2 * Hkv,), (ROPE_THREADS,)
    if ks is None:
        fn, args = _function("rope_kv_store.cu", "rope_kv_store_f16", pdl), (q, k, v, q_out, K, V)
    else:
        fn, args = (_function("rope_kv_store.cu", "rope_kv_store_i8", pdl),
                    (q, k, v, q_out, K, V, ks, vs))
    _launch(fn, grid, block, args + dims, stream, pdl=pdl)
    return q_out


def supports(D, Dv, int8):
    """Does the attention kernel have these head dims? It copies whole 16-byte pieces of rows (int8
    rows: multiples of 16 values) and is compiled for key dims 32..256, value dims up to 256."""
    m = 16 if int8 else 8
    return 32 <= D <= 256 and 0 < Dv <= 256 and D % m == 0 and Dv % m == 0


def shape(D, Dv, int8):
    """The Shape the kernel is compiled for at these head dims and cache kind."""
    stage = KEYS_A_STAGE * (D + Dv) * (1 if int8 else 2) + (8 * KEYS_A_STAGE if int8 else 0)
    stages = min(8, max(2, WARP_BYTES // stage))
    merge = max(WARPS * 4 * Dv * 4, 4 * MAX_SPLITS * 4 + max(WARPS * 32, Dv) * 16)   # see the C
    return Shape(WARPS, stages, max(WARPS * stages * stage, merge), BLOCKS_PER_SM,
                 KEYS_A_STAGE * WARPS)


def _kernel(D, Dv, int8, use_pdl):
    """The f16 or int8 kernel of the module for (D, Dv): one module holds both, so its defines
    carry both kinds' ring depths and the larger shared size."""
    s, other = shape(D, Dv, int8), shape(D, Dv, not int8)
    f16, i8 = (other, s) if int8 else (s, other)
    defines = {"DA_D": D, "DA_DV": Dv, "DA_NW": s.warps, "DA_STG_F16": f16.stages,
               "DA_STG_I8": i8.stages, "DA_SMEM": max(s.shared_bytes, other.shared_bytes),
               "DA_MIN_BLOCKS": s.blocks_per_sm}
    name = "decode_attention_i8" if int8 else "decode_attention_f16"

    def configure(fn):
        if s.shared_bytes > 48 * 1024:            # above the default dynamic shared limit
            fn.max_dynamic_shared_size_bytes = s.shared_bytes
        # all of L1 as shared memory, so blocks_per_sm rings fit an SM (cp.async.cg skips L1)
        fn.preferred_shared_memory_carveout = 100
    return _function("decode_attention.cu", name, use_pdl, defines, configure), s


@functools.lru_cache(maxsize=None)
def _sm_info(device_id):
    props = cp.cuda.runtime.getDeviceProperties(device_id)
    return props["multiProcessorCount"], props.get("sharedMemPerMultiprocessor", 233472)


def _resident_blocks(smem, min_blocks):
    try:
        sms, per_sm = _sm_info(cp.cuda.Device().id)
    except AttributeError:       # no device API (the host emulation in the tests)
        sms, per_sm = 132, 233472
    # static shared (~1.5 KB at 8 warps) and the 1 KB the driver keeps a block
    return sms * max(1, min(min_blocks, per_sm // (smem + 3072)))


def grid_shape(H, Hkv, S_max, D, Dv, int8):
    """(block columns, splits): a column is a KV head and a group of its query heads; as many
    splits as fit one wave of resident blocks."""
    s = shape(D, Dv, int8)
    cols = Hkv * -(-(H // Hkv) // HEADS_PER_BLOCK)
    splits = min(MAX_SPLITS, max(1, _resident_blocks(s.shared_bytes, s.blocks_per_sm) // cols),
                 -(-S_max // s.min_keys))
    return cols, splits


def attention(q, K, V, ks, vs, pos_dev, scale, window, counters, stream, pdl=False):
    """q (H, D) f32 against cache K (Hkv, S_max, D), V (Hkv, S_max, Dv) up to *pos_dev -> (H, Dv);
    int8 caches with their per-row scales ks, vs, else ks = vs = None. counters: from
    new_counters(), at least one per block column; launches on one stream may share them (each
    launch hands them back zeroed). Head dims the kernel lacks (supports): the tiled kernel."""
    H, D = q.shape
    Hkv, S_max, Dv = V.shape
    int8 = ks is not None
    if not supports(D, Dv, int8):
        return tiled_attention(q, K, V, ks, vs, pos_dev, scale, window, counters, stream, pdl)
    cols, ns = grid_shape(H, Hkv, S_max, D, Dv, int8)
    if counters.size < cols:
        raise ValueError(f"decode attention needs {cols} counters, got {counters.size}")
    fn, s = _kernel(D, Dv, int8, pdl)
    pm = cp.empty((cols, ns, HEADS_PER_BLOCK), np.float32)
    pl = cp.empty((cols, ns, HEADS_PER_BLOCK), np.float32)
    pacc = cp.empty((cols, ns, HEADS_PER_BLOCK, Dv), np.float32)
    out = cp.empty((H, Dv), np.float32)
    tail = (pm, pl, pacc, counters, out, pos_dev, np.int32(H), np.int32(Hkv), np.int32(S_max),
            np.float32(scale), np.int32(window), np.int32(s.min_keys))
    head = (q, K, V, ks, vs) if int8 else (q, K, V)
    _launch(fn, (cols, ns), (32 * s.warps,), head + tail, stream, shared_mem=s.shared_bytes, pdl=pdl)
    return out


# --- The tiled kernel (kernels/cuda/decode_attention_tiled.cu): the head dims the default lacks:
#
# int8 rows that are no whole 16-byte pieces, key dims below 32, value dims above 256. The same
# contract as attention: position from the device, a grid fixed by the cache size, the splits merged
# by the last block of a column. Its four warps walk tiles of keys together (K loads, a block
# barrier, softmax, a barrier, V loads), which serves any head dims that are multiples of 8 (keys up
# to TILED_MAX_KEY_DIM, values up to 8 * TILED_THREADS) but keeps one load round in flight a block,
# so it is not the default.

TILED_HEADS_PER_BLOCK = 4        # DEC_GB in the CUDA source
TILED_MAX_SPLITS = 64            # DEC_MAX_SPLITS: the grid's splits per KV head (fixed by S_max)
TILED_MIN_KEYS_PER_SPLIT = 64    # fewer keys a split would cost more in the merge than they save
TILED_THREADS = 128              # DEC_THREADS
TILED_MAX_KEY_DIM = 256          # DEC_MAX_D
_tiled_modules = {}              # PDL on -> the module


def _tiled_kernel(name, use_pdl):
    if use_pdl not in _tiled_modules:
        code = ("#include <cuda_fp16.h>\n" + pdl.source_head(use_pdl)
                + source("decode_attention_tiled.cu"))
        _tiled_modules[use_pdl] = cp.RawModule(code=code, options=("--std=c++17",))
    return _tiled_modules[use_pdl].get_function(name)


def tiled_check_dims(D, Dv):
    """Raise if the tiled kernel cannot serve these head dims."""
    if D % 8 or D > TILED_MAX_KEY_DIM or Dv % 8 or Dv // 8 > TILED_THREADS:
        raise ValueError(f"decode attention needs head dims that are multiples of 8, keys at most "
                         f"{TILED_MAX_KEY_DIM} and values at most {8 * TILED_THREADS}, "
                         f"got {D}/{Dv}")


@functools.lru_cache(maxsize=None)
def _tiled_resident_blocks(device_id):
    """Blocks the GPU holds at once: the kernel's __launch_bounds__ keep it at 168 registers a
    thread, room for three 128-thread blocks an SM (ptxas, sm_90). More splits than that would run
    a second, mostly idle wave at long contexts."""
    return 3 * cp.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"]


def _tiled_current_resident_blocks():
    try:
        return _tiled_resident_blocks(cp.cuda.Device().id)
    except AttributeError:       # no device API (the host emulation in the tests)
        return 3 * 132


def tiled_grid_shape(H, Hkv, S_max):
    """(block columns, splits) of the tiled kernel: a column is a KV head and a group of its query
    heads."""
    G = H // Hkv
    cols = Hkv * -(-G // TILED_HEADS_PER_BLOCK)
    splits = min(TILED_MAX_SPLITS, max(1, _tiled_current_resident_blocks() // cols),
                 -(-S_max // TILED_MIN_KEYS_PER_SPLIT))
    return cols, splits


def tiled_attention(q, K, V, ks, vs, pos_dev, scale, window, counters, stream, pdl=False):
    """attention's contract, on the tiled kernel."""
    H, D = q.shape
    Hkv, S_max, Dv = V.shape
    tiled_check_dims(D, Dv)
    cols, ns = tiled_grid_shape(H, Hkv, S_max)
    if counters.size < cols:
        raise ValueError(f"decode attention needs {cols} counters, got {counters.size}")
    pm = cp.empty((cols, ns, TILED_HEADS_PER_BLOCK), np.float32)
    pl = cp.empty((cols, ns, TILED_HEADS_PER_BLOCK), np.float32)
    pacc = cp.empty((cols, ns, TILED_HEADS_PER_BLOCK, Dv), np.float32)
    out = cp.empty((H, Dv), np.float32)
    common = (pm, pl, pacc, counters, out, pos_dev, np.int32(H), np.int32(Hkv), np.int32(D),
              np.int32(Dv), np.int32(S_max), np.float32(scale), np.int32(window),
              np.int32(TILED_MIN_KEYS_PER_SPLIT))
    if ks is None:
        fn, args = _tiled_kernel("decode_attention_tiled_f16", pdl), (q, K, V)
    else:
        fn, args = _tiled_kernel("decode_attention_tiled_i8", pdl), (q, K, V, ks, vs)
    _launch(fn, (cols, ns), (TILED_THREADS,), args + common, stream, pdl=pdl)
    return out
