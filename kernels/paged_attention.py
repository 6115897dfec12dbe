"""The server's batched step against the paged KV pool (CUDA C in kernels/cuda/paged_attention.cu).

Two launches a layer for all rows of a step, whatever the number of sequences:
  rope_store   RoPE of every row's q and k at the row's own position, k and v into the row's page
               slot (f16, or int8 with a scale per (block, head, position));
  attention    decode attention of N sequences at once, each query row against its own length and
               block table (GQA, sliding window), its keys cut into splits merged by a second small
               launch when one split per sequence would leave the GPU idle.
Pool layout (lite/engine/paged_kv.py BlockPool): K (n_blocks, Hkv, B, D), V (n_blocks, Hkv, B, Dv); scales
(n_blocks, Hkv, B) f32. Every wrapper takes the CuPy stream to launch on and never synchronizes.
attention_reference is the plain NumPy twin the tests hold the kernel to.
"""
import functools

import cupy as cp
import numpy as np

from lite.kernels.cuda_source import current_device, source

ROPE_THREADS = 64            # PA_ROPE_THREADS
MAX_ROW = 1024               # PA_MAX_ROW
WARPS = 4                    # PA_WARPS
HEADS_PER_BLOCK = 4          # PA_GB
MAX_HEAD_DIM = 256           # PA_MAX_D
MAX_SPLITS = 32
MIN_KEYS_PER_SPLIT = 128     # fewer keys a split would cost more in the merge than they save
TARGET_BLOCKS = 264          # about two blocks an SM on an H200 (132 SMs): splits stop there
MERGE_THREADS = 128
_functions = {}              # (device, name) -> the kernel


@functools.lru_cache(maxsize=None)
def _module():
    return cp.RawModule(code="#include <cuda_fp16.h>\n" + source("paged_attention.cu"),
                        options=("--std=c++17",))


def _function(name):
    key = (current_device(cp), name)
    if key not in _functions:
        _functions[key] = _module().get_function(name)
    return _functions[key]


def _i32(a, what):
    if a.dtype != np.int32 or not a.flags.c_contiguous:
        raise ValueError(f"{what} must be a contiguous int32 array, got {a.dtype}")
    return a


def rope_store(q, k, v, K, V, ks, vs, positions, slots, rope, stream):
    """q (R, H, D), k (R, Hkv, D), v (R, Hkv, Dv) f32 contiguous; row r at position positions[r]
    (int32 (R,)) goes to page slot slots[r] (int32 (R,): block * B + offset; negative: not stored).
    Returns q rotated (R, H, D); k rotated and v stored into the pool K, V (f16, or int8 with scales
    ks, vs; else None). rope: (n_rot, base, freq_scale, neox), or None for no rotation."""
    R, H, D = q.shape
    n_blocks, Hkv, B, Dv = V.shape
    if k.shape != (R, Hkv, D) or v.shape != (R, Hkv, Dv) or K.shape != (n_blocks, Hkv, B, D):
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape} do not fit the pool {K.shape}/{V.shape}")
    if max(D, Dv) > MAX_ROW:
        raise ValueError(f"head dims above {MAX_ROW}: {D}/{Dv}")
    if positions.shape != (R,) or slots.shape != (R,):
        raise ValueError(f"{R} rows need {R} positions and slots, got {positions.shape}/{slots.shape}")
    n_rot, base, freq_scale, neox = rope or (0, 1.0, 1.0, False)
    q_out = cp.empty_like(q)
    if R == 0:
        return q_out
    dims = (_i32(positions, "positions"), _i32(slots, "slots"), np.int32(H), np.int32(Hkv),
            np.int32(D), np.int32(Dv), np.int32(B), np.int32(n_rot), np.float64(base),
            np.float64(freq_scale), np.int32(bool(neox)))
    if ks is None:
        fn, args = _function("paged_rope_store_f16"), (q, k, v, q_out, K, V)
    else:
        fn, args = _function("paged_rope_store_i8"), (q, k, v, q_out, K, V, ks, vs)
    fn((H + 2 * Hkv, R), (ROPE_THREADS,), args + dims, stream=stream)
    return q_out


def check_dims(D, Dv):
    if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
        raise ValueError(f"paged attention serves head dims up to {MAX_HEAD_DIM}, got {D}/{Dv}")


def grid_shape(N, H, Hkv, max_keys):
    """(block columns, splits): a column is one KV head and up to HEADS_PER_BLOCK of its query heads;
    splits so that the step fills about TARGET_BLOCKS blocks, each split MIN_KEYS_PER_SPLIT keys or more."""
    cols = Hkv * -(-(H // Hkv) // HEADS_PER_BLOCK)
    want = -(-TARGET_BLOCKS // max(1, N * cols))
    return cols, max(1, min(MAX_SPLITS, want, max_keys // MIN_KEYS_PER_SPLIT))


def attention(q, rows, lens, tables, K, V, ks, vs, scale, window, stream, out=None, max_keys=None,
              splits=None):
    """Sequence n's query q[rows[n]] (q (R, H, D) f32, rotated) against its first lens[n] positions
    (the last `window` of them when window > 0) in the pool K (n_blocks, Hkv, B, D), V (n_blocks,
    Hkv, B, Dv) through its block table tables[n] (tables (N, max_blocks) int32) -> out[rows[n]]
    (out (R, H * Dv) f32, made if None; other rows untouched). int8 pools with scales ks, vs.
    max_keys: the most keys any sequence attends to (chooses the splits; the host knows it)."""
    R, H, D = q.shape
    n_blocks, Hkv, B, Dv = V.shape
    N, max_blocks = tables.shape
    check_dims(D, Dv)
    if H % Hkv or rows.shape != (N,) or lens.shape != (N,):
        raise ValueError(f"q {q.shape} with {Hkv} KV heads, rows {rows.shape}, lens {lens.shape}, "
                         f"tables {tables.shape}")
    if out is None:
        out = cp.empty((R, H * Dv), np.float32)
    if N == 0:
        return out
    cols, ns = grid_shape(N, H, Hkv, max_keys if max_keys is not None else max_blocks * B)
    ns = splits or ns
    pm = cp.empty((N, H, ns), np.float32)
    pl = cp.empty((N, H, ns), np.float32)
    pacc = cp.empty((N, H, ns, Dv), np.float32)
    tail = (out, pm, pl, pacc, np.int32(H), np.int32(Hkv), np.int32(D), np.int32(Dv), np.int32(B),
            np.int32(max_blocks), np.int32(ns), np.float32(scale), np.int32(window))
    head = (q, _i32(rows, "rows"), _i32(lens, "lens"), _i32(tables, "tables"), K, V)
    if ks is None:
        _function("paged_attention_f16")((cols * ns, N), (32 * WARPS,), head + tail, stream=stream)
    else:
        _function("paged_attention_i8")((cols * ns, N), (32 * WARPS,), head + (ks, vs) + tail,
                                        stream=stream)
    if ns > 1:
        _function("paged_attention_merge")((H, N), (MERGE_THREADS,),
                                           (pm, pl, pacc, rows, out, np.int32(H), np.int32(Dv),
                                            np.int32(ns)), stream=stream)
    return out


def attention_reference(q, rows, lens, tables, K, V, ks, vs, scale, window):
    """attention's contract in NumPy (float64): {row: (H * Dv,)} for the rows it writes."""
    H, D = q.shape[1:]
    Hkv, B, Dv = V.shape[1], V.shape[2], V.shape[3]
    got = {}
    for n in range(len(rows)):
        L = int(lens[n])
        j = np.arange(max(0, L - window) if window else 0, L)
        blk, off = np.asarray(tables[n])[j // B], j % B
        Kf, Vf = K[blk, :, off].astype(np.float64), V[blk, :, off].astype(np.float64)  # (S, Hkv, .)
        if ks is not None:
            Kf, Vf = Kf * ks[blk, :, off][..., None], Vf * vs[blk, :, off][..., None]
        o = np.empty((H, Dv))
        for h in range(H):
            hk = h // (H // Hkv)
            s = Kf[:, hk] @ q[rows[n], h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            o[h] = p @ Vf[:, hk] / p.sum()
        got[int(rows[n])] = o.reshape(-1)
    return got
