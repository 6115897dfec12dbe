"""Decode-step attention as CuPy RawKernels: RoPE + KV-cache store in one launch, then attention
with its split merge in the same launch (CUDA C in kernels/cupy_decode_src.py).

Two launches a layer instead of six (rope q, rope k, store k, store v, attend, combine): in a
captured decode graph each launch costs ~2 us of ramp and tail besides its work. Every wrapper
takes the CuPy stream to launch on, reads the position from pos_dev and never synchronizes.

Two attention kernels, same contract: v2 (the default since session 3: warp-private cp.async
streams, kernels/cupy_decode2_src.py) and v1 (LITE_DECODE_ATTN=v1, and where v2 lacks the head
dims). On the H200, 8B head shape (scripts/bench_decode_attn.py --variant v1,v2), f16 cache:
512 keys 14.3 -> 6.1 us, 8K 32.9 -> 13.2 us (2.5 TB/s of K+V), 32K 96.9 -> 42.1 us (3.1 TB/s);
int8: 17.0 -> 6.2, 38.6 -> 13.6, 132.3 -> 36.4 us. Decode of the 8B file, tg128 after 512 / 8K /
32K: 278 / 235 / 164 -> 319 / 284 / 233 tok/s.
"""
import functools

import cupy as cp
import numpy as np

from lite.kernels import pdl
from lite.kernels.pdl import call as _launch
from lite.kernels.cuda_source import source

HEADS_PER_BLOCK = 4        # DEC_GB in the CUDA source
MAX_SPLITS = 64            # DEC_MAX_SPLITS: the grid's splits per KV head (fixed by S_max)
MIN_KEYS_PER_SPLIT = 64    # fewer keys a split would cost more in the merge than they save
THREADS = 128              # DEC_THREADS
MAX_KEY_DIM = 256          # DEC_MAX_D
MAX_ROW = 1024             # DEC_MAX_ROW
ROPE_THREADS = 64          # DEC_ROPE_THREADS
_modules = {}          # (file, PDL on) -> the module


def module_source(name, use_pdl, defines=None):
    """The text NVRTC compiles for kernels/cuda/<name>."""
    return "#include <cuda_fp16.h>\n" + pdl.source_head(use_pdl) + source(name, defines=defines)


def _kernel(name, use_pdl):
    file = "rope_kv_store.cu" if name.startswith("rope_kv_store") else "decode_attention_tiled.cu"
    key = (file, pdl.source_head(use_pdl))
    if key not in _modules:
        _modules[key] = cp.RawModule(code=module_source(file, use_pdl), options=("--std=c++17",))
    return _modules[key].get_function(name)


def check_dims(D, Dv):
    """Raise if the kernels cannot serve these head dims."""
    if D % 8 or D > MAX_KEY_DIM or Dv % 8 or Dv // 8 > THREADS:
        raise ValueError(f"decode attention needs head dims that are multiples of 8, keys at most "
                         f"{MAX_KEY_DIM} and values at most {8 * THREADS}, got {D}/{Dv}")


def rope_kv_store(q, k, v, K, V, ks, vs, pos_dev, rope, stream, norm=None, pdl=False):
    """One token: q (H, D) rotated into a new array (returned); k (Hkv, D) rotated and v (Hkv, Dv)
    stored into the caches K (Hkv, S_max, D), V (Hkv, S_max, Dv) at *pos_dev (f16, or int8 with
    per-row scales ks, vs (Hkv, S_max)). rope: (n_rot, base, freq_scale, neox), or None.
    norm: (q weights or None, k weights or None, eps), or None: each q and k head RMS-normed with
    its (D,) f32 weights before the rotation (qwen3's per-head QK norm; the sums in the order of
    cupy_ops.rms_norm). pdl: launched with programmatic dependencies (kernels/pdl.py)."""
    H, D = q.shape
    Hkv, S_max, Dv = V.shape
    if max(D, Dv) > MAX_ROW:
        raise ValueError(f"head dims above {MAX_ROW}: {D}/{Dv}")
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
        _launch(_kernel("rope_kv_store_f16", pdl), grid, block, (q, k, v, q_out, K, V) + dims, stream,
                pdl=pdl)
    else:
        _launch(_kernel("rope_kv_store_i8", pdl), grid, block, (q, k, v, q_out, K, V, ks, vs) + dims,
                stream, pdl=pdl)
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


def attn_decode(q, K, V, ks, vs, pos_dev, scale, window, counters, stream, pdl=False):
    """q (H, D) f32 against cache K (Hkv, S_max, D), V (Hkv, S_max, Dv) up to *pos_dev -> (H, Dv).
    counters: from new_counters(), at least one per block column; launches on one stream may
    share them (each launch hands them back zeroed). The v2 kernel where it has the head dims
    (v2_supported), else v1. pdl: launched with programmatic dependencies (kernels/pdl.py)."""
    if v2_supported(q.shape[1], V.shape[2], ks is not None):
        return _attn_decode_v2(q, K, V, ks, vs, pos_dev, scale, window, counters, stream, pdl)
    return attn_decode_v1(q, K, V, ks, vs, pos_dev, scale, window, counters, stream, pdl)


def attn_decode_v1(q, K, V, ks, vs, pos_dev, scale, window, counters, stream, pdl=False):
    """attn_decode on the v1 kernel: the head dims v2 lacks (any multiple of 8, keys up to
    MAX_KEY_DIM)."""
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
        _launch(_kernel("attn_decode_f16", pdl), grid, block, (q, K, V) + common, stream, pdl=pdl)
    else:
        _launch(_kernel("attn_decode_i8", pdl), grid, block, (q, K, V, ks, vs) + common, stream,
                pdl=pdl)
    return out


# --- v2 (the default) ------------------------------------------------------------------------------
# The block shape: warps a block; bytes of cp.async ring a warp (stages = V2_WARP_BYTES // bytes of
# an 8-key stage, 2..8); blocks an SM the register cap (__launch_bounds__) is set for.
V2_WARPS = 8
V2_WARP_BYTES = 12288
V2_BLOCKS_PER_SM = 2
V2_MAX_SPLITS = 128        # D2_MAX_SPLITS
V2_KEYS_A_STAGE = 8        # D2_KW
_modules2 = {}


def v2_supported(D, Dv, int8):
    """v2 copies whole 16-byte pieces of rows (int8 rows: multiples of 16 values) and is compiled
    for key dims 32..256 and value dims up to 256."""
    m = 16 if int8 else 8
    return 32 <= D <= 256 and 0 < Dv <= 256 and D % m == 0 and Dv % m == 0


def v2_config(D, Dv, int8):
    """(warps, stages, dynamic shared bytes, blocks an SM, min keys a split) of the v2 kernel."""
    nw = V2_WARPS
    stage = V2_KEYS_A_STAGE * (D + Dv) * (1 if int8 else 2) + (8 * V2_KEYS_A_STAGE if int8 else 0)
    stages = min(8, max(2, V2_WARP_BYTES // stage))
    merge = max(nw * 4 * Dv * 4, 4 * V2_MAX_SPLITS * 4 + max(nw * 32, Dv) * 16)   # see the C
    smem = max(nw * stages * stage, merge)
    return nw, stages, smem, V2_BLOCKS_PER_SM, V2_KEYS_A_STAGE * nw


def _kernel2(D, Dv, int8, use_pdl):
    nw, stages, smem, min_blocks, _ = v2_config(D, Dv, int8)
    other = v2_config(D, Dv, not int8)
    f16_stages, i8_stages = (other[1], stages) if int8 else (stages, other[1])
    try:
        device = cp.cuda.Device().id           # function attributes are per device
    except AttributeError:                      # no device API (the host emulation in the tests)
        device = -1
    key = (device, D, Dv, nw, min_blocks, f16_stages, i8_stages, max(smem, other[2]), use_pdl)
    if key not in _modules2:
        defines = {"D2_D": D, "D2_DV": Dv, "D2_NW": nw, "D2_STG_F16": f16_stages,
                   "D2_STG_I8": i8_stages, "D2_SMEM": key[-2], "D2_MIN_BLOCKS": min_blocks}
        code = module_source("decode_attention.cu", use_pdl, defines)
        _modules2[key] = (cp.RawModule(code=code, options=("--std=c++17",)), {})
    module, fns = _modules2[key]
    name = "attn_decode2_i8" if int8 else "attn_decode2_f16"
    if name not in fns:
        fn = module.get_function(name)
        if smem > 48 * 1024:                      # above the default dynamic shared limit
            fn.max_dynamic_shared_size_bytes = smem
        # all of L1 as shared memory, so blocks_per_sm rings fit an SM (cp.async.cg skips L1)
        fn.preferred_shared_memory_carveout = 100
        fns[name] = fn
    fn = fns[name]
    return fn, nw, smem


@functools.lru_cache(maxsize=None)
def _sm_info(device_id):
    props = cp.cuda.runtime.getDeviceProperties(device_id)
    return props["multiProcessorCount"], props.get("sharedMemPerMultiprocessor", 233472)


def _resident_blocks_v2(smem, min_blocks):
    try:
        sms, per_sm = _sm_info(cp.cuda.Device().id)
    except AttributeError:       # no device API (the host emulation in the tests)
        sms, per_sm = 132, 233472
    # static shared (~1.5 KB at 8 warps) and the 1 KB the driver keeps a block
    return sms * max(1, min(min_blocks, per_sm // (smem + 3072)))


def grid_shape_v2(H, Hkv, S_max, D, Dv, int8):
    """(block columns, splits) of v2: as many splits as fit one wave of resident blocks."""
    nw, _, smem, min_blocks, min_chunk = v2_config(D, Dv, int8)
    cols = Hkv * -(-(H // Hkv) // HEADS_PER_BLOCK)
    splits = min(V2_MAX_SPLITS, max(1, _resident_blocks_v2(smem, min_blocks) // cols),
                 -(-S_max // min_chunk))
    return cols, splits


def _attn_decode_v2(q, K, V, ks, vs, pos_dev, scale, window, counters, stream, use_pdl):
    H, D = q.shape
    Hkv, S_max, Dv = V.shape
    int8 = ks is not None
    cols, ns = grid_shape_v2(H, Hkv, S_max, D, Dv, int8)
    if counters.size < cols:
        raise ValueError(f"attn_decode needs {cols} counters, got {counters.size}")
    fn, nw, smem = _kernel2(D, Dv, int8, use_pdl)
    pm = cp.empty((cols, ns, HEADS_PER_BLOCK), np.float32)
    pl = cp.empty((cols, ns, HEADS_PER_BLOCK), np.float32)
    pacc = cp.empty((cols, ns, HEADS_PER_BLOCK, Dv), np.float32)
    out = cp.empty((H, Dv), np.float32)
    tail = (pm, pl, pacc, counters, out, pos_dev, np.int32(H), np.int32(Hkv), np.int32(S_max),
            np.float32(scale), np.int32(window), np.int32(v2_config(D, Dv, int8)[4]))
    head = (q, K, V, ks, vs) if int8 else (q, K, V)
    _launch(fn, (cols, ns), (32 * nw,), head + tail, stream, shared_mem=smem, pdl=use_pdl)
    return out
