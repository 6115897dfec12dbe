"""Prefill attention in one pass (flash attention, FlashAttention-2 style) on tensor cores.

CUDA C through CuPy (NVRTC), with inline PTX `mma.sync.m16n8k16` and `ldmatrix` rather than
<mma.h>/wmma: CuPy's pip wheels ship no crt/mma.h, so wmma does not compile for pip-only users.

Why: the materialized path (lite/backends/cuda.py) writes and reads a (G*T, S) fp32 score block and
an fp16 probability block per KV head, which at 32K context costs more than the matrix products.
Here scores never leave registers.

One CTA = BM query rows (BM/16 warps of 16 rows; BM by head dim in TILE) of one head. The CTAs of
the heads that share a KV head run next to each other, so they read the same K/V tiles while those
are in L2; the last query tiles (the ones that attend to the most keys, when causal) start first.
Per tile of keys (64; 32 at D = 256), staged in shared memory by cp.async (double-buffered: the
next tile loads while this one is used):
  S = Q K^T   mma.sync, Q fragments held in registers for the whole kernel (at D = 256 read from
              shared memory by ldmatrix), K by ldmatrix;
  mask        causal from pos0 (the chunk sees the whole cache before it) and the sliding window,
              only on tiles that cross a mask edge;
  softmax     online, in the m16n8 accumulator layout (a thread holds rows lane/4 and lane/4+8,
              columns 2*(lane%4)+{0,1} of each 8-key slice): the row max over the 4 threads of a
              quad by two shuffles, exp2 with the scale folded in;
  O += P V    P repacked from the S accumulators straight into A fragments (fp16), V by
              ldmatrix.trans, O in fp32 registers rescaled by exp2(m_old - m_new).
Shapes: q (T, H, D) f32; K/V caches (Hkv, S_max, D) f16, positions 0..pos0+T-1 used; out (T, H, D)
f32. D = Dv = 64, 128 or 256 (other head dims take the materialized path); at 256 Q's fragments
are read from shared memory each tile instead of held in registers (TILE says why). An int8 KV
cache is served through the fp16 copy of its first S positions that the backend makes anyway.
paged_prefill: the same tiles over the server's paged pool (lite/engine/paged_kv.py BlockPool: K, V
(n_blocks, Hkv, B, D), f16, or int8 with a scale per (block, head, position) dequantized to fp16
as a tile is loaded, the very fp16 of the pool's gathered copy; those loads go through registers,
not cp.async, so they overlap less with the math than f16 pages do), the prompt chunks of all the
sequences of a step in one launch (grid.y: KV head and chunk; a chunk's key rows through its block
table; CTAs past a shorter chunk's rows return at once).
The CUDA C is kernels/cuda/flash_attention.cu and flash_attention_paged.cu over the tile loop of
flash_attention_body.cuh (its PTX in flash_attention_ptx.cuh);
tests/test_flash_attn_emulated.py runs it under the host CUDA C emulator, tests/test_flash_attn.py
holds a NumPy twin of its D <= 128 fragment layouts (CPU CI), tests/test_paged_flash_emulated.py
runs the paged kernel. The CUDA backend's default prefill
attention where the head dim allows (BackendConfig.flash_attention; D = 256 also needs
BackendConfig.flash_attention_256).
"""
from collections import namedtuple

import numpy as np

from lite.kernels.cuda_source import current_device, source

LOG2E = 1.4426950408889634
# By head dim: query rows a CTA (16 a warp), keys a tile, CTAs an SM it is compiled to fit
# (__launch_bounds__: the register cap), and whether Q's fragments live in shared memory.
# D=64 and 128: the shapes measured fastest on the H200 (at D=128 one CTA of 128 rows, 230
# registers; at D=64 three of 64 rows, 166 registers, no spills).
# D=256: O alone is 128 registers a thread, so Q moves to shared memory (as FlashAttention-2 does)
# and the tile is 64 rows by 32 keys, whose 99 KiB (Q plus double-buffered K and V) let two CTAs
# share an H100/H200 SM (FlashAttention-2's 64-row choice there) and still fit sm_86's opt-in limit.
Tile = namedtuple("Tile", "rows keys min_ctas q_smem")
TILE = {64: Tile(rows=64, keys=64, min_ctas=3, q_smem=False),
        128: Tile(rows=128, keys=64, min_ctas=1, q_smem=False),
        256: Tile(rows=64, keys=32, min_ctas=2, q_smem=True)}
_kernels = {}


def smem_bytes(D, bm=None):
    """Dynamic shared bytes: K and V (two stages of the tile's keys), and Q where it lives there;
    rows padded by 8 halves."""
    tile = TILE[D]
    rows = 2 * 2 * tile.keys + (bm or tile.rows) * tile.q_smem
    return rows * (D + 8) * 2


def kernel_source(D, bm, min_ctas, pages=None):
    """The text NVRTC compiles: kernels/cuda/flash_attention.cu for head dim D, bm query rows a CTA
    and min_ctas CTAs an SM; with pages ("f16" or "int8") flash_attention_paged.cu over such pages."""
    tile = TILE[D]
    defines = {"D": D, "BM": bm, "BN": tile.keys, "MIN_CTAS": min_ctas,
               "Q_SMEM": int(tile.q_smem), "FA_SMEM": smem_bytes(D, bm)}
    if pages is None:
        return source("flash_attention.cu", defines=defines)
    return source("flash_attention_paged.cu", defines=dict(defines, PAGE_INT8=int(pages == "int8")))


def supported(D, Dv):
    """Head dims the kernel takes (the backend gates 256 behind BackendConfig.flash_attention_256)."""
    return D == Dv and D in TILE


def _kernel(D, bm, min_ctas, pages=None):
    import cupy as cp
    key = (current_device(cp), D, bm, min_ctas, pages)
    if key not in _kernels:
        module = cp.RawModule(code=kernel_source(D, bm, min_ctas, pages), options=("--std=c++17",))
        k = module.get_function("flash_fwd" if pages is None else "flash_fwd_paged")
        k.max_dynamic_shared_size_bytes = smem_bytes(D, bm)
        _kernels[key] = k
    return _kernels[key]


def flash_prefill(q, K, V, pos0, window, scale, stream, bm=None, min_ctas=None):
    """q (T, H, D) f32 against the f16 caches K, V (Hkv, S_max, D) (positions 0..pos0+T-1 written),
    causal from position pos0 and within a sliding window when window > 0 -> (T, H, D) f32."""
    import cupy as cp
    T, H, D = q.shape
    Hkv, S_max, Dv = V.shape
    if not supported(D, Dv) or K.shape != V.shape or H % Hkv:
        raise ValueError(f"flash prefill needs D = Dv in {tuple(TILE)} and H a multiple of Hkv, "
                         f"got q {q.shape}, K {K.shape}, V {V.shape}")
    if pos0 + T > S_max:
        raise ValueError(f"positions up to {pos0 + T} past the cache's {S_max}")
    bm, min_ctas = _tile_shape(D, bm, min_ctas)
    out = cp.empty((T, H, D), np.float32)
    grid = (-(-T // bm) * (H // Hkv), Hkv)
    args = (cp.ascontiguousarray(q, dtype=np.float32), cp.ascontiguousarray(K),
            cp.ascontiguousarray(V), out, np.int32(T), np.int32(H), np.int32(Hkv), np.int32(S_max),
            np.int64(pos0), np.int32(window), np.float32(scale * LOG2E))
    _kernel(D, bm, min_ctas)(grid, (bm // 16 * 32,), args, shared_mem=smem_bytes(D, bm),
                             stream=stream)
    return out


def _tile_shape(D, bm, min_ctas):
    """(query rows a CTA, CTAs an SM): TILE's for head dim D unless given."""
    tile = TILE[D]
    bm = bm or tile.rows
    return bm, min_ctas or max(1, tile.min_ctas * tile.rows // bm)


def paged_prefill(q, chunks, tables, K, V, ks, vs, max_rows, scale, window, stream, out=None,
                  bm=None, min_ctas=None):
    """The prompt chunks of a server step in one launch, over the paged pool K, V (n_blocks, Hkv,
    B, D), f16, or int8 with scales ks, vs (n_blocks, Hkv, B) (else None). Chunk n is the rows
    chunks[n, 0] .. + chunks[n, 1] of q (R, H, D) f32 (rotated, its k and v already in the pages)
    at positions from chunks[n, 2], causal over its keys through block table tables[n] (tables
    (N, max_blocks) int32), within a sliding window when window > 0 -> those rows of out (R, H * D)
    f32 (made if None; other rows untouched). max_rows: the most rows of a chunk (the host knows it)."""
    import cupy as cp
    R, H, D = q.shape
    n_blocks, Hkv, B, Dv = V.shape
    N = tables.shape[0]
    if not supported(D, Dv) or K.shape != V.shape or H % Hkv:
        raise ValueError(f"paged flash prefill needs D = Dv in {tuple(TILE)} and H a multiple of "
                         f"Hkv, got q {q.shape}, K {K.shape}, V {V.shape}")
    if chunks.shape != (N, 3) or chunks.dtype != np.int32 or tables.dtype != np.int32:
        raise ValueError(f"chunks (N, 3) and tables (N, max_blocks) int32, got {chunks.shape} "
                         f"{chunks.dtype}, {tables.shape} {tables.dtype}")
    pages = "int8" if ks is not None else "f16"
    if (K.dtype != np.int8) if ks is not None else (K.dtype != np.float16):
        raise ValueError(f"{pages} pages expected, got {K.dtype}")
    if out is None:
        out = cp.empty((R, H * D), np.float32)
    if N == 0 or max_rows == 0:
        return out
    bm, min_ctas = _tile_shape(D, bm, min_ctas)
    grid = (-(-int(max_rows) // bm) * (H // Hkv), Hkv * N)
    null = np.uint64(0)                       # f16 pages: no scales (a null pointer)
    args = (cp.ascontiguousarray(q, dtype=np.float32), chunks, tables, np.int32(tables.shape[1]),
            K, V, null if ks is None else ks, null if vs is None else vs, out, np.int32(H),
            np.int32(Hkv), np.int32(B), np.int32(window), np.float32(scale * LOG2E))
    _kernel(D, bm, min_ctas, pages)(grid, (bm // 16 * 32,), args, shared_mem=smem_bytes(D, bm),
                                    stream=stream)
    return out
