// One-pass prefill attention on tensor cores over a contiguous KV cache (kernels/flash_attention.py
// says how; the tile loop is flash_attention_body.cuh's, over the paged pool flash_attention_paged.cu).
#include <cuda_fp16.h>

#include "flash_attention_body.cuh"

// the caches K, V (Hkv, S_max, D) f16 of one KV head's rows: key j's row at j * D
struct ContiguousKV {
    const __half* Kh;
    const __half* Vh;
    __device__ __forceinline__ void load(__half* k_dst, __half* v_dst, int j, int c, bool ok) const {
        const long long src = (long long)(ok ? j : 0) * D + c;
        cp_async_16(k_dst, Kh + src, ok);
        cp_async_16(v_dst, Vh + src, ok);
    }
};

// grid (query tiles x G, Hkv): the CTAs of the heads that share a KV head side by side
extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS) flash_fwd(const float* __restrict__ q,
        const __half* __restrict__ K, const __half* __restrict__ V, float* __restrict__ out,
        int T, int H, int Hkv, int S_max, long long pos0, int window, float scale_log2) {
    const int G = H / Hkv, hk = blockIdx.y;
    const long long head = (long long)hk * S_max * D;
    const ContiguousKV kv{K + head, V + head};
    flash_tiles(q, out, kv, T, H, hk * G + blockIdx.x % G, blockIdx.x / G, (int)pos0, window,
                scale_log2);                           // positions fit an int (S <= S_max)
}
