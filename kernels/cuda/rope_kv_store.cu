// RoPE of one decode token's q and k, and its k, v into the KV cache, in one launch (launched by
// kernels/decode_attention.py); the position read from the device.
#include "pdl.cuh"
#include "rope_row.cuh"

#define DEC_MAX_ROW 1024     // the longest row rope_kv_store handles

// --- RoPE of q and k, and k, v into the cache at *pos, in one launch (a block a row) -----------
// Blocks 0..H-1 rotate the q heads into q_out; blocks H..H+Hkv-1 rotate the k heads into the K
// cache; the next Hkv blocks copy the v heads into the V cache. n_rot = 0: no rotation. int8
// caches (scales != null) get one scale per (head, position) = amax / 127, as KVCache._quantize.
// qn, kn (either may be null): per-head RMSNorm weights (D values) of q and of k (qwen3's
// attn_q_norm/attn_k_norm), applied before the rotation as small_ops.cu's rms_norm kernel would.
// DEC_ROPE_THREADS threads a row: one rotated pair each at head dim 128 (the double-precision
// angle is the longest chain of the launch).
#define DEC_ROPE_THREADS 64
// 1/rms of x[0..n) (n <= DEC_MAX_ROW), with the sums in the order of small_ops.cu's rms_norm:
// there a thread an element (pow2 >= 32 threads), 32-element warp sums by xor shuffles, then the
// warp sums (zeros for the missing warps) by xor shuffles. Here the warps take the 32-element
// chunks in turn and the chunk sums meet in `chunk`, so the sum tree, and its rounding, is the
// same. All threads of the block call it (it holds a __syncthreads) and get the result.
__device__ __forceinline__ float dec_rms_inv(const float* x, int n, float eps, float* chunk) {
    const int lane = threadIdx.x & 31, nc = (n + 31) >> 5;
    for (int c = threadIdx.x >> 5; c < nc; c += blockDim.x >> 5) {   // uniform over the warp
        int i = c * 32 + lane;
        float s = 0.f;
        if (i < n) { float v = x[i]; s += v * v; }
        s = dec_warp_sum(s);
        if (lane == 0) chunk[c] = s;
    }
    __syncthreads();
    float s = lane < nc ? chunk[lane] : 0.f;
    return rsqrtf(dec_warp_sum(s) / n + eps);
}
template <typename T> __device__ void rope_kv_store(
        const float* q, const float* k, const float* v, float* q_out, T* Kc, T* Vc, float* ks,
        float* vs, const long long* pos_ptr, int H, int Hkv, int D, int Dv, int S_max, int n_rot,
        double base, double freq_scale, int neox, const float* qn, const float* kn, float eps) {
    __shared__ float row[DEC_MAX_ROW];
    __shared__ float wmax[DEC_ROPE_THREADS / 32];
    __shared__ float chunk[DEC_MAX_ROW / 32];
    const int b = blockIdx.x;
    long long pos = *pos_ptr;
    const float* src;
    const float* nw = nullptr;                     // this row's norm weights, if any
    float* fdst = nullptr;
    T* cdst = nullptr;
    float* sdst = nullptr;
    int n = D, rot = n_rot;
    if (b < H) {
        src = q + (long long)b * D;
        fdst = q_out + (long long)b * D;
        nw = qn;
    } else if (b < H + Hkv) {
        int h = b - H;
        src = k + (long long)h * D;
        cdst = Kc + ((long long)h * S_max + pos) * D;
        if (ks) sdst = ks + (long long)h * S_max + pos;
        nw = kn;
    } else {
        int h = b - H - Hkv;
        src = v + (long long)h * Dv;
        n = Dv;
        rot = 0;
        cdst = Vc + ((long long)h * S_max + pos) * Dv;
        if (vs) sdst = vs + (long long)h * S_max + pos;
    }
    // the normed value x * r * w, as rms_norm writes it, then rotated as the rope kernel reads it
    const float r = nw ? dec_rms_inv(src, n, eps, chunk) : 1.f;   // uniform over the block
    rope_row(row, src, n, rot, pos, base, freq_scale, neox, nw, r);
    __syncthreads();
    store_row(row, n, fdst, cdst, sdst, wmax);
}
extern "C" __global__ void rope_kv_store_f16(const float* q, const float* k, const float* v,
        float* q_out, __half* Kc, __half* Vc, const long long* p, int H, int Hkv, int D, int Dv,
        int S, int n_rot, double base, double fs, int neox, const float* qn, const float* kn,
        float eps)
{ PDL_PROLOGUE(); rope_kv_store<__half>(q, k, v, q_out, Kc, Vc, nullptr, nullptr, p, H, Hkv, D, Dv, S, n_rot, base, fs, neox, qn, kn, eps); }
extern "C" __global__ void rope_kv_store_i8(const float* q, const float* k, const float* v,
        float* q_out, signed char* Kc, signed char* Vc, float* ks, float* vs, const long long* p,
        int H, int Hkv, int D, int Dv, int S, int n_rot, double base, double fs, int neox,
        const float* qn, const float* kn, float eps)
{ PDL_PROLOGUE(); rope_kv_store<signed char>(q, k, v, q_out, Kc, Vc, ks, vs, p, H, Hkv, D, Dv, S, n_rot, base, fs, neox, qn, kn, eps); }

