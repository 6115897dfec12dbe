// One head row of q, k or v on its way to attention, shared by the decode step's rope_kv_store.cu
// and the server's paged_attention.cu: rotated into shared memory, then written out as f32 (q),
// f16, or int8 with one scale per (head, position) = amax / 127 (the caches' _quantize).
#include "warp_reduce.cuh"

__device__ __forceinline__ void kv_store_value(__half* p, float v) { *p = __float2half(v); }
__device__ __forceinline__ void kv_store_value(signed char* p, float v) { *p = (signed char)v; }

// row[0..n) = src rotated by RoPE at position pos over its first rot values (neox: pairs (i,
// i + rot/2), else (2i, 2i + 1)), the rest copied; with nw, each value x * r * nw first (a per-head
// RMSNorm, r its 1/rms). Angles in double, as the rope kernel computes them: long positions keep
// precision. The caller syncs the block before reading row.
__device__ __forceinline__ void rope_row(float* row, const float* src, int n, int rot, long long pos,
                                         double base, double freq_scale, int neox, const float* nw, float r) {
    const int tid = threadIdx.x, nt = blockDim.x, half = rot / 2;
    for (int i = tid; i < half; i += nt) {
        double ang = (double)pos * freq_scale * pow(base, -2.0 * i / rot), sd, cd;
        sincos(ang, &sd, &cd);
        float c = (float)cd, s = (float)sd;
        int a = neox ? i : 2 * i, bb = neox ? i + half : 2 * i + 1;
        float xa = src[a], xb = src[bb];
        if (nw) { xa = xa * r * nw[a]; xb = xb * r * nw[bb]; }
        row[a] = xa * c - xb * s;
        row[bb] = xa * s + xb * c;
    }
    for (int j = rot + tid; j < n; j += nt) row[j] = nw ? src[j] * r * nw[j] : src[j];
}

// The rotated row out: to fdst (f32) if given, else to the cache cdst, int8 with its scale to
// *sdst when sdst is given. wmax: shared scratch of blockDim.x / 32 floats.
template <typename T>
__device__ __forceinline__ void store_row(const float* row, int n, float* fdst, T* cdst, float* sdst, float* wmax) {
    const int tid = threadIdx.x, nt = blockDim.x;
    if (fdst) {
        for (int j = tid; j < n; j += nt) fdst[j] = row[j];
        return;
    }
    if (sdst == nullptr) {
        for (int j = tid; j < n; j += nt) kv_store_value(cdst + j, row[j]);
        return;
    }
    float amax = 0.f;
    for (int j = tid; j < n; j += nt) amax = fmaxf(amax, fabsf(row[j]));
    amax = dec_warp_max(amax);
    if ((tid & 31) == 0) wmax[tid >> 5] = amax;
    __syncthreads();
    for (int w = 0; w < nt / 32; ++w) amax = fmaxf(amax, wmax[w]);
    float sc = amax / 127.f;
    float div = sc > 0.f ? sc : 1.f;
    for (int j = tid; j < n; j += nt) kv_store_value(cdst + j, fminf(fmaxf(rintf(row[j] / div), -127.f), 127.f));
    if (tid == 0) *sdst = sc;
}
