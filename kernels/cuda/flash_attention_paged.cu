// One-pass prefill attention on tensor cores over the paged KV pool (kernels/flash_attention.py
// says how; the tile loop is flash_attention_body.cuh's): the prompt chunks of a server step, all
// sequences in one launch, each against its own block table. Set by the launcher besides the
// tile's defines: PAGE_INT8 (1: int8 pages with an f32 scale per (block, head, position),
// dequantized to fp16 as a tile is loaded; 0: f16 pages, copied by cp.async).
//
// Pool layout (lite/engine/paged_kv.py BlockPool): K, V (n_blocks, Hkv, B, D); scales ks, vs
// (n_blocks, Hkv, B). Position j of a sequence lives in block table[j / B] at offset j % B.
#include <cuda_fp16.h>

#include "flash_attention_body.cuh"

#if PAGE_INT8
typedef signed char page_t;
#else
typedef __half page_t;
#endif

// one KV head's rows of one sequence in the pool, through its block table
struct PagedKV {
    const page_t* K;
    const page_t* V;
    const float* ks;
    const float* vs;
    const int* table;
    int Hkv, hk, B;
    __device__ __forceinline__ void load(__half* k_dst, __half* v_dst, int j, int c, bool ok) const {
        const long long at = ok ? ((long long)table[j / B] * Hkv + hk) * B + j % B : 0;
#if PAGE_INT8
        // the same fp16 as the gathered copy: each int8 times its f32 scale, rounded once
        uint4 k16 = {0u, 0u, 0u, 0u}, v16 = {0u, 0u, 0u, 0u};
        if (ok) {
            k16 = dequant8(*reinterpret_cast<const uint2*>(K + at * D + c), ks[at]);
            v16 = dequant8(*reinterpret_cast<const uint2*>(V + at * D + c), vs[at]);
        }
        *reinterpret_cast<uint4*>(k_dst) = k16;
        *reinterpret_cast<uint4*>(v_dst) = v16;
#else
        cp_async_16(k_dst, K + at * D + c, ok);
        cp_async_16(v_dst, V + at * D + c, ok);
#endif
    }
#if PAGE_INT8
    static __device__ __forceinline__ unsigned dequant2(unsigned w, int i, float s) {
        return pack_half2((float)(signed char)(w >> (16 * i)) * s,
                          (float)(signed char)(w >> (16 * i + 8)) * s);
    }
    static __device__ __forceinline__ uint4 dequant8(uint2 w, float s) {
        uint4 r;
        r.x = dequant2(w.x, 0, s);
        r.y = dequant2(w.x, 1, s);
        r.z = dequant2(w.y, 0, s);
        r.w = dequant2(w.y, 1, s);
        return r;
    }
#endif
};

// grid (query tiles of the longest chunk x G, Hkv x N). Chunk n: chunks[3n..] = its first row in
// q and out, its rows T, the position of its first row; keys 0 .. its last position through
// tables[n] (max_blocks entries). q (R, H, D) f32 (rotated); out (R, H * D) f32, the chunks' rows
// written, other rows untouched. ks, vs: null for f16 pages.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS) flash_fwd_paged(
        const float* __restrict__ q, const int* __restrict__ chunks, const int* __restrict__ tables,
        int max_blocks, const page_t* __restrict__ K, const page_t* __restrict__ V,
        const float* __restrict__ ks, const float* __restrict__ vs, float* __restrict__ out,
        int H, int Hkv, int B, int window, float scale_log2) {
    const int G = H / Hkv, n = blockIdx.y / Hkv, hk = blockIdx.y % Hkv;
    const int row0 = chunks[3 * n], T = chunks[3 * n + 1], p0 = chunks[3 * n + 2];
    const PagedKV kv{K, V, ks, vs, tables + (long long)n * max_blocks, Hkv, hk, B};
    const long long at = (long long)row0 * H * D;
    flash_tiles(q + at, out + at, kv, T, H, hk * G + blockIdx.x % G, blockIdx.x / G, p0, window,
                scale_log2);
}
