#include "pdl.cuh"

#ifndef LITE_HOST_SHIM   // (the host emulator of the tests brings its own)
__device__ __forceinline__ float half_bits_to_float(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
#endif
// Byte j of w as an exact float, minus `off`: 0x4B0000bb reads as 2^23 + bb.
#define BF(w, j, off) (__int_as_float(__byte_perm((w), 0x4B000000u, 0x7440u | (j))) - (8388608.f + (off)))
#define LO4 0x0F0F0F0Fu
// Loads of block bytes: from global memory through the read-only path, or (SH) from shared memory.
template <bool SH> __device__ __forceinline__ unsigned ldw(const unsigned char* p) {
    if constexpr (SH) return *(const unsigned*)p; else return __ldg((const unsigned*)p); }
template <bool SH> __device__ __forceinline__ uint4 ld16(const unsigned char* p) {
    if constexpr (SH) return *(const uint4*)p; else return __ldg((const uint4*)p); }
template <bool SH> __device__ __forceinline__ unsigned short ldh(const unsigned char* p) {
    if constexpr (SH) return *(const unsigned short*)p; else return __ldg((const unsigned short*)p); }
// Sum of 16 weights (4 words of 4 bytes, zero point off) times 4 float4 of x.
__device__ __forceinline__ float dot16(unsigned a, unsigned b, unsigned c, unsigned d, const float4* xv, float off) {
    const unsigned q[4] = {a, b, c, d};
    float s = 0.f;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        s = fmaf(BF(q[k], 0, off), xv[k].x, s); s = fmaf(BF(q[k], 1, off), xv[k].y, s);
        s = fmaf(BF(q[k], 2, off), xv[k].z, s); s = fmaf(BF(q[k], 3, off), xv[k].w, s);
    }
    return s;
}
__device__ __forceinline__ float dot8(unsigned a, unsigned b, const float4* xv, float off) {
    float s = 0.f;
    s = fmaf(BF(a, 0, off), xv[0].x, s); s = fmaf(BF(a, 1, off), xv[0].y, s);
    s = fmaf(BF(a, 2, off), xv[0].z, s); s = fmaf(BF(a, 3, off), xv[0].w, s);
    s = fmaf(BF(b, 0, off), xv[1].x, s); s = fmaf(BF(b, 1, off), xv[1].y, s);
    s = fmaf(BF(b, 2, off), xv[1].z, s); s = fmaf(BF(b, 3, off), xv[1].w, s);
    return s;
}
// The 8 float4 of x that chunk c of type T meets, and the sums of its first and last 4 (what
// every T::dot takes): one loader for all the kernels that walk a row's chunks.
template <class T>
__device__ __forceinline__ void load_x(const float* xr, int c, float4 (&xv)[8], float& xa, float& xb) {
    #pragma unroll
    for (int k = 0; k < 8; k++) xv[k] = __ldg((const float4*)(xr + T::xoff(c, k)));
    xa = (xv[0].x + xv[0].y + xv[0].z + xv[0].w) + (xv[1].x + xv[1].y + xv[1].z + xv[1].w)
       + (xv[2].x + xv[2].y + xv[2].z + xv[2].w) + (xv[3].x + xv[3].y + xv[3].z + xv[3].w);
    xb = (xv[4].x + xv[4].y + xv[4].z + xv[4].w) + (xv[5].x + xv[5].y + xv[5].z + xv[5].w)
       + (xv[6].x + xv[6].y + xv[6].z + xv[6].w) + (xv[7].x + xv[7].y + xv[7].z + xv[7].w);
}
// acc summed over a block of 4 warps: each warp by shuffles, then the warps' partials through red
// (ends with a __syncthreads). Thread r*NX+n (< NR*NX) gets row r, x n; the others get 0.
template <int NR, int NX>   // not R, N: matvec_iq.py #defines R
__device__ __forceinline__ float block_sum(const float (&acc)[NR][NX], float (&red)[4][NR * NX]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    #pragma unroll
    for (int r = 0; r < NR; r++)
        #pragma unroll
        for (int n = 0; n < NX; n++) {
            float v = acc[r][n];
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) red[warp][r * NX + n] = v;
        }
    __syncthreads();
    const int i = threadIdx.x;
    return i < NR * NX ? (red[0][i] + red[1][i]) + (red[2][i] + red[3][i]) : 0.f;
}
// 6-bit scales (sc) and minimums (mn) of Q4_K/Q5_K sub-blocks 2j, 2j+1 as bytes e, e+1 of a word.
__device__ __forceinline__ float kblock_scales(uint4 h, int j, float sa, float sb, float xa, float xb) {
    const bool lo = j < 2;
    const unsigned sc = lo ? (h.y & 0x3F3F3F3Fu) : ((h.w & LO4) | ((h.y >> 2) & 0x30303030u));
    const unsigned mn = lo ? (h.z & 0x3F3F3F3Fu) : (((h.w >> 4) & LO4) | ((h.z >> 2) & 0x30303030u));
    const int e = 2 * (j & 1);
    const float d = half_bits_to_float((unsigned short)(h.x & 0xFFFFu)), dm = half_bits_to_float((unsigned short)(h.x >> 16));
    return d * (BF(sc, e, 0.f) * sa + BF(sc, e + 1, 0.f) * sb) - dm * (BF(mn, e, 0.f) * xa + BF(mn, e + 1, 0.f) * xb);
}
