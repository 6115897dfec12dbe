"""Prefill attention in one pass (flash attention, FlashAttention-2 style) on tensor cores.

CUDA C through CuPy (NVRTC), with inline PTX `mma.sync.m16n8k16` and `ldmatrix` rather than
<mma.h>/wmma: CuPy's pip wheels ship no crt/mma.h, so wmma does not compile for pip-only users.

Why: the materialized path (lite/backends/cuda.py) writes and reads a (G*T, S) fp32 score block and
an fp16 probability block per KV head, which at 32K context costs more than the matrix products.
Here scores never leave registers.

One CTA = BM query rows (BM/16 warps of 16 rows; BM by head dim in TILE) of one head. The CTAs of
the heads that share a KV head run next to each other, so they read the same K/V tiles while those
are in L2; the last query tiles (the ones that attend to the most keys, when causal) start first. Per tile of 64 keys, staged in
shared memory by cp.async (double-buffered: the next tile loads while this one is used):
  S = Q K^T   mma.sync, Q fragments held in registers for the whole kernel, K by ldmatrix;
  mask        causal from pos0 (the chunk sees the whole cache before it) and the sliding window,
              only on tiles that cross a mask edge;
  softmax     online, in the m16n8 accumulator layout (a thread holds rows lane/4 and lane/4+8,
              columns 2*(lane%4)+{0,1} of each 8-key slice): the row max over the 4 threads of a
              quad by two shuffles, exp2 with the scale folded in;
  O += P V    P repacked from the S accumulators straight into A fragments (fp16), V by
              ldmatrix.trans, O in fp32 registers rescaled by exp2(m_old - m_new).
Shapes: q (T, H, D) f32; K/V caches (Hkv, S_max, D) f16, positions 0..pos0+T-1 used; out (T, H, D)
f32. D = Dv = 64 or 128 (other head dims, e.g. 256, take the materialized path). An int8 KV cache is
served through the fp16 copy of its first S positions that the backend makes anyway.
tests/test_flash_attn.py has a NumPy twin of the fragment layouts (runs in CPU CI) and the GPU tests
against a float64 reference and the materialized path.

The default prefill attention of the CUDA backend (LITE_FLASH_ATTN=0: the materialized path).
Measured on the H200 (2026-11-29), 8B shape (H 32, Hkv 8, D 128), one 2048-query chunk, per layer
(scripts/bench_flash_attn.py): context 8192: 0.93 ms (258 TFLOP/s) against 3.06 ms materialized;
context 32768: 3.98 ms (268 TFLOP/s) against 14.3 ms. lite bench on the 8B Q4_K file, --prefill
2048: pp8192 22,646 tok/s (materialized 15,073), pp32768 14,713 (7,118); llama.cpp on the same GPU:
10,402 and 8,624.
"""
import numpy as np

from lite.kernels.cuda_source import source


BN = 64                                                # keys a tile (the kernel's BN)
LOG2E = 1.4426950408889634
# Query rows a CTA (16 a warp) and CTAs an SM should hold (__launch_bounds__: the register cap),
# by head dim. D=128 on the H200 (T 2048, context 8192 / 32768): 128 rows, 1 CTA (230 registers)
# 0.93 / 3.98 ms; 64 rows, 2 CTAs (248 registers) 0.99 / 4.22 ms; 64 rows, 3 CTAs (168 registers,
# 68 bytes spilled) 1.33 / 5.71 ms. D=64: 64 rows, 3 CTAs, 166 registers, no spills (untimed;
# 128 rows passes the same tests).
TILE = {64: (64, 3), 128: (128, 1)}
_kernels = {}


def kernel_source(D, bm, min_ctas):
    """The text NVRTC compiles: kernels/cuda/flash_attention.cu for head dim D, bm query rows a CTA
    and min_ctas CTAs an SM."""
    return source("flash_attention.cu", defines={"D": D, "BM": bm, "MIN_CTAS": min_ctas})


def smem_bytes(D):
    return 2 * 2 * BN * (D + 8) * 2                    # K and V, two stages, padded rows


def supported(D, Dv):
    return D == Dv and D in (64, 128)


def _kernel(D, bm, min_ctas):
    import cupy as cp
    key = (cp.cuda.Device().id, D, bm, min_ctas)
    if key not in _kernels:
        k = cp.RawKernel(kernel_source(D, bm, min_ctas), "flash_fwd", options=("--std=c++17",))
        k.max_dynamic_shared_size_bytes = smem_bytes(D)
        _kernels[key] = k
    return _kernels[key]


def flash_prefill(q, K, V, pos0, window, scale, stream, bm=None, min_ctas=None):
    """q (T, H, D) f32 against the f16 caches K, V (Hkv, S_max, D) (positions 0..pos0+T-1 written),
    causal from position pos0 and within a sliding window when window > 0 -> (T, H, D) f32."""
    import cupy as cp
    T, H, D = q.shape
    Hkv, S_max, Dv = V.shape
    if not supported(D, Dv) or K.shape != V.shape or H % Hkv:
        raise ValueError(f"flash prefill needs D = Dv in (64, 128) and H a multiple of Hkv, got "
                         f"q {q.shape}, K {K.shape}, V {V.shape}")
    if pos0 + T > S_max:
        raise ValueError(f"positions up to {pos0 + T} past the cache's {S_max}")
    bm0, mc0 = TILE[D]
    bm, min_ctas = bm or bm0, min_ctas or max(1, mc0 * bm0 // (bm or bm0))
    out = cp.empty((T, H, D), np.float32)
    grid = (-(-T // bm) * (H // Hkv), Hkv)
    args = (cp.ascontiguousarray(q, dtype=np.float32), cp.ascontiguousarray(K),
            cp.ascontiguousarray(V), out, np.int32(T), np.int32(H), np.int32(Hkv), np.int32(S_max),
            np.int64(pos0), np.int32(window), np.float32(scale * LOG2E))
    _kernel(D, bm, min_ctas)(grid, (bm // 16 * 32,), args, shared_mem=smem_bytes(D), stream=stream)
    return out
