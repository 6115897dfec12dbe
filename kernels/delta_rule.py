"""The Gated DeltaNet on the GPU (qwen3next's recurrent layers): CUDA C in kernels/cuda/delta_rule.cu.

  conv_silu   the causal depthwise conv + silu over a chunk, its window (K-1, C) carried in place
  l2_norm     q and k per head
  gates       beta = sigmoid(b), g = A * softplus(a + dt_bias)
  decode      one token of the delta rule, the state (Hv, dk, dv) in place (fixed shapes: capturable)
  chunked     the chunked form over a prompt chunk (chunks of CHUNK tokens), the state in place
  sigmoid_mul gated attention's output gate
  decode_fused      one token from the projections: conv_silu, l2_norm, gates, decode in one launch
  sigmoid_gate_add  the shared expert's gate and add (base + sigmoid(h . w) x)

float32 in and out, the semantics of lite/backends/cpu_recurrent.py (tests/test_delta_rule_emulated.py
runs this very C on the host against it). Every wrapper takes the CuPy stream to launch on and never
synchronizes; inputs that are views are copied contiguous first.
"""
import functools

import cupy as cp
import numpy as np

from lite.kernels.cuda_source import current_device, source

CHUNK = 64                 # DR_BT: tokens a chunk (lite/backends/cpu_recurrent.py DELTA_CHUNK)
CHUNK_THREADS = 256        # DR_NT
DECODE_WARPS = 4           # DR_NW: the warps of a decode block share a head's dk rows
COLUMN_TILE = 32           # the most value columns of S a chunked block takes
MAX_SHARED = 227 * 1024    # the opt-in shared memory of a block on sm_80/sm_90
CONV_WARPS = 8             # warps of a conv block (rows in turn)
_functions = {}            # (device, dk, tile, name) -> the kernel


def column_tile(dv):
    """Value columns a chunked block takes: up to COLUMN_TILE (more blocks a head, each redoing
    the head's A and solve, against fewer blocks than SMs)."""
    return min(COLUMN_TILE, dv)


def shared_bytes(dk, tile):
    """The chunked block's shared memory: S's columns, K, Q, W (rows padded by one), U, A, four vectors."""
    return 4 * (dk * tile + 3 * CHUNK * (dk + 1) + CHUNK * tile + CHUNK * CHUNK + 4 * CHUNK)


@functools.lru_cache(maxsize=None)
def _module(device, dk, tile):
    defines = {"DR_DK": dk, "DR_DVT": tile, "DR_BT": CHUNK, "DR_NT": CHUNK_THREADS,
               "DR_NW": DECODE_WARPS, "DR_SMEM": shared_bytes(dk, tile)}
    return cp.RawModule(code=source("delta_rule.cu", defines=defines), options=("--std=c++17",))


def _function(name, dk=16, tile=16):
    """A kernel of the module compiled for key head dim dk and column tile (the elementwise ones
    take any: they come from the smallest)."""
    key = (current_device(cp), dk, tile, name)
    if key not in _functions:
        fn = _module(key[0], dk, tile).get_function(name)
        smem = shared_bytes(dk, tile)
        if name == "delta_rule_chunked" and smem > 48 * 1024:    # above the default dynamic limit
            fn.max_dynamic_shared_size_bytes = smem
        _functions[key] = fn
    return _functions[key]


def _f32(a):
    return cp.ascontiguousarray(a, dtype=np.float32)


def conv_silu(x, w, state, stream):
    """x (T, C), taps w (C, K) (the last on the current row), window state (K-1, C) updated in
    place -> silu(conv) (T, C)."""
    x, w = _f32(x), _f32(w)
    T, C = x.shape
    K = w.shape[1]
    if w.shape[0] != C or state.shape != (K - 1, C) or state.dtype != np.float32:
        raise ValueError(f"conv_silu: x {x.shape}, taps {w.shape}, window {state.shape} {state.dtype}")
    y = cp.empty((T, C), np.float32)
    if T:
        warps = min(CONV_WARPS, T)
        _function("conv_silu")((-(-C // 32),), (32 * warps,),
                               (x, w, state, y, np.int32(T), np.int32(C), np.int32(K)), stream=stream)
    return y


def l2_norm(x, eps, stream):
    """x / sqrt(sum x^2 + eps) over the last axis, same shape."""
    x = _f32(x)
    n = x.shape[-1]
    rows = x.size // n if n else 0
    y = cp.empty(x.shape, np.float32)
    if rows:
        _function("l2_norm")((-(-rows // 4),), (128,), (x, y, np.int32(rows), np.int32(n),
                                                         np.float32(eps)), stream=stream)
    return y


def gates(b, a, A, dt_bias, stream):
    """(g, beta), each (T, Hv): g = A * softplus(a + dt_bias) (the log decay), beta = sigmoid(b)."""
    b, a, A, dt_bias = _f32(b), _f32(a), _f32(A).reshape(-1), _f32(dt_bias).reshape(-1)
    Hv = A.size
    if b.shape != a.shape or b.shape[-1] != Hv or dt_bias.size != Hv:
        raise ValueError(f"delta_gates: b {b.shape}, a {a.shape}, A {A.shape}, dt_bias {dt_bias.shape}")
    g, beta = cp.empty(b.shape, np.float32), cp.empty(b.shape, np.float32)
    if b.size:
        _function("delta_gates")((-(-b.size // 256),), (256,),
                                 (b, a, A, dt_bias, g, beta, np.int32(b.size), np.int32(Hv)), stream=stream)
    return g, beta


def sigmoid_mul(x, gate, stream):
    """x * sigmoid(gate), elementwise (same shapes)."""
    x, gate = _f32(x), _f32(gate)
    if x.shape != gate.shape:
        raise ValueError(f"sigmoid_mul: x {x.shape}, gate {gate.shape}")
    y = cp.empty(x.shape, np.float32)
    if x.size:
        _function("sigmoid_mul")((-(-x.size // 256),), (256,), (x, gate, y, np.int64(x.size)),
                                 stream=stream)
    return y


def sigmoid_gate_add(base, x, h, w, stream):
    """base + sigmoid(h . w) x row by row: base, x (T, n), h (T, n_embd), w (n_embd,) (the shared
    expert's gate and add in one launch)."""
    base, x, h, w = _f32(base), _f32(x), _f32(h), _f32(w).reshape(-1)
    T, n = x.shape
    if base.shape != x.shape or h.shape != (T, w.size):
        raise ValueError(f"sigmoid_gate_add: base {base.shape}, x {x.shape}, h {h.shape}, w {w.shape}")
    out = cp.empty((T, n), np.float32)
    if x.size:
        _function("sigmoid_gate_add")((-(-n // 256), T), (256,),
                                      (base, x, h, w, out, np.int32(n), np.int32(w.size)), stream=stream)
    return out


def decode_fused(qkv, ba, conv_w, window, A, dt_bias, S, counters, eps, scale, stream):
    """One token of a Gated DeltaNet layer in one launch: conv_silu of qkv (1, C) (taps conv_w
    (C, K), window (K-1, C) in place), l2_norm of q and k, gates from ba (1, Hk * 2r) (per key head
    [b | a]), A and dt_bias (Hv,), and decode on S (Hv, dk, dv) in place -> out (1, Hv, dv).
    counters: Hk or more int32 zeros on the device (left zero)."""
    qkv, ba, conv_w = _f32(qkv), _f32(ba), _f32(conv_w)
    A, dt_bias = _f32(A).reshape(-1), _f32(dt_bias).reshape(-1)
    Hv, dk, dv = S.shape
    C, K = conv_w.shape
    Hk = (C - Hv * dv) // (2 * dk) if dk else 0
    if (qkv.shape != (1, C) or Hk <= 0 or Hv % Hk or C != 2 * Hk * dk + Hv * dv
            or ba.shape != (1, 2 * Hv) or A.size != Hv or dt_bias.size != Hv
            or window.shape != (K - 1, C) or counters.size < Hk or counters.dtype != np.int32):
        raise ValueError(f"delta decode: qkv {qkv.shape}, ba {ba.shape}, taps {conv_w.shape}, window "
                         f"{window.shape}, state {S.shape}, {counters.size} counters")
    for a in (window, S):
        if a.dtype != np.float32 or not a.flags.c_contiguous:
            raise ValueError("delta decode: the states must be contiguous float32 arrays (updated in place)")
    out = cp.empty((1, Hv, dv), np.float32)
    _function("delta_decode_fused", dk, column_tile(dv))(
        (Hv, -(-dv // 32)), (32 * DECODE_WARPS,),
        (qkv, ba, conv_w, window, A, dt_bias, S, out, counters, np.int32(Hk), np.int32(Hv),
         np.int32(dv), np.int32(K), np.float32(eps), np.float32(scale)), stream=stream)
    return out


def _check(q, k, v, g, beta, S):
    """The shapes of a delta rule call: (T, Hk, dk, Hv, dv); raises on anything else."""
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1], v.shape[2]
    if (k.shape != q.shape or v.shape[0] != T or g.shape != (T, Hv) or beta.shape != (T, Hv)
            or Hv % Hk or S.shape != (Hv, dk, dv)):
        raise ValueError(f"delta rule: q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, "
                         f"beta {beta.shape}, state {S.shape}")
    if S.dtype != np.float32 or not S.flags.c_contiguous:
        raise ValueError("delta rule: the state must be a contiguous float32 array (updated in place)")
    return T, Hk, dk, Hv, dv


def decode(q, k, v, g, beta, S, scale, stream):
    """One token: q, k (1, Hk, dk), v (1, Hv, dv), g, beta (1, Hv); S (Hv, dk, dv) updated in place
    -> out (1, Hv, dv) = scale * S^T q per value head."""
    q, k, v, g, beta = (_f32(a) for a in (q, k, v, g, beta))
    T, Hk, dk, Hv, dv = _check(q, k, v, g, beta, S)
    if T != 1:
        raise ValueError(f"delta rule decode: one token, got {T}")
    out = cp.empty((1, Hv, dv), np.float32)
    _function("delta_rule_decode", dk, column_tile(dv))((Hv, -(-dv // 32)), (32 * DECODE_WARPS,),
                                       (q, k, v, g, beta, S, out, np.int32(Hk), np.int32(Hv),
                                        np.int32(dv), np.float32(scale)), stream=stream)
    return out


def chunked(q, k, v, g, beta, S, scale, stream):
    """T tokens: q, k (T, Hk, dk), v (T, Hv, dv), g, beta (T, Hv); S (Hv, dk, dv) updated in place
    -> out (T, Hv, dv). A block a (value head, column tile of S), its chunks in order."""
    q, k, v, g, beta = (_f32(a) for a in (q, k, v, g, beta))
    T, Hk, dk, Hv, dv = _check(q, k, v, g, beta, S)
    tile = column_tile(dv)
    if shared_bytes(dk, tile) > MAX_SHARED:
        raise ValueError(f"delta rule: key head dim {dk} needs {shared_bytes(dk, tile)} bytes of "
                         f"shared memory a block, more than {MAX_SHARED}")
    out = cp.empty((T, Hv, dv), np.float32)
    if T:
        _function("delta_rule_chunked", dk, tile)(
            (Hv, -(-dv // tile)), (CHUNK_THREADS,),
            (q, k, v, g, beta, S, out, np.int32(T), np.int32(Hk), np.int32(Hv), np.int32(dv),
             np.float32(scale)), stream=stream, shared_mem=shared_bytes(dk, tile))
    return out
