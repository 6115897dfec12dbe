// The batched products on the tensor cores (kernels/batched_mma.py): the int8 mma fragments (with their host
// emulation for tests/cuda_c_emulator.py), the tile shape, and the x quantizer batched_quantize_x.
#include "pdl.cuh"

#define BMMA_ROWS 64        // weight rows a CTA: 4 warps of 16
#define BMMA_K 256          // columns a K step: one K-quant superblock, 8 Q8_0 blocks
#define BMMA_STRIDE 272     // bytes a row of a shared int8 tile: 256 + 16, so a warp's fragment loads hit 32 banks

#ifndef LITE_HOST_SHIM   // (the host emulator of the tests brings its own)
__device__ __forceinline__ float half_bits_to_float(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
#endif

#ifdef __CUDA_ARCH__
// C (int32, 16 x 8) = A (16 x 32 int8, rows) B (32 x 8 int8, columns): lane 4g + q holds A's rows g, g + 8 at
// k = 4q..4q+3 (a0, a1) and 16 + 4q.. (a2, a3), B's column g at the same k (b0, b1), C's rows g, g + 8 at
// columns 2q, 2q + 1 (c0, c1; c2, c3).
__device__ __forceinline__ void bmma_k32(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}
// The same over k = 16 (A's a0, a1 and B's b0 as above): Q6_K's scales go by 16 weights.
__device__ __forceinline__ void bmma_k16(int (&c)[4], unsigned a0, unsigned a1, unsigned b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3]) : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}
#else   // the host emulator: the warp's fragments exchanged through its WarpState, each lane its C
inline int bmma_byte(unsigned v, int i) { return (int)(signed char)(v >> (8 * i)); }
inline void bmma_exchange(int (&c)[4], int K) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    tl_warp->bar->arrive_and_wait();
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
        int s = 0;
        for (int k = 0; k < K; k++) {
            const unsigned* al = tl_warp->mma[4 * (row & 7) + ((k & 15) >> 2)];
            const unsigned* bl = tl_warp->mma[4 * col + ((k & 15) >> 2)];
            s += bmma_byte(al[(row >= 8) + 2 * (k >= 16)], k & 3) * bmma_byte(bl[4 + (k >= 16)], k & 3);
        }
        c[i] = s;
    }
    tl_warp->bar->arrive_and_wait();
}
inline void bmma_k32(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    unsigned* mine = tl_warp->mma[threadIdx.x & 31];
    mine[0] = a0; mine[1] = a1; mine[2] = a2; mine[3] = a3; mine[4] = b0; mine[5] = b1;
    bmma_exchange(c, 32);
}
inline void bmma_k16(int (&c)[4], unsigned a0, unsigned a1, unsigned b0) {
    unsigned* mine = tl_warp->mma[threadIdx.x & 31];
    mine[0] = a0; mine[1] = a1; mine[2] = 0; mine[3] = 0; mine[4] = b0; mine[5] = 0;
    bmma_exchange(c, 16);
}
#endif

// x (n rows of cols floats) in runs of 32 columns, each run as x = d (254 hi + lo) with hi, lo int8 (the
// two-part form of kernels/matvec_q8.py, there over runs of 16 in a type's chunk order: here a k = 32 mma sums
// 32 consecutive columns under one scale, llama.cpp's q8_1 blocks): hi, lo (n, cols) int8, d and s (n,
// cols / 32) float, s the run's sum of the quantized x (Q4_K's minimums meet it). A warp a run; grid
// (cols / 32 / 4 rounded up, n), 128 threads.
__global__ void __launch_bounds__(128) batched_quantize_x(const float* __restrict__ x, signed char* __restrict__ hi,
        signed char* __restrict__ lo, float* __restrict__ d, float* __restrict__ s, int cols) {
    const int runs = cols / 32, run = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const long long at = (long long)blockIdx.y * cols + 32LL * run + lane;
    PDL_PROLOGUE();
    const bool live = run < runs;
    const float v = live ? x[at] : 0.f;
    float a = fabsf(v);
    for (int o = 1; o < 32; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float t = a > 0.f ? v * (127.f / a) : 0.f;
    const int h = __float2int_rn(t), l = __float2int_rn((t - (float)h) * 254.f);
    int sum = 254 * h + l;                    // exact: |.| <= 32 * 32385
    for (int o = 1; o < 32; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (!live) return;
    hi[at] = (signed char)h;
    lo[at] = (signed char)l;
    if (lane == 0) {
        const float dr = a * (1.f / (127.f * 254.f));
        d[(long long)blockIdx.y * runs + run] = dr;
        s[(long long)blockIdx.y * runs + run] = dr * (float)sum;
    }
}
