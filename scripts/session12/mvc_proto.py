"""Session 12 prototype (device only, not lite's code yet): IQ3_XXS's decode product on the tensor
cores. Why: the per-thread products (mv_iq2, mvt) spend ~112 instructions a chunk of 32 weights and a
row, 16 of them dp4a and ~20 the float tail a chunk; here a warp's mma.sync.m16n8k16 (f16 in, f32
accumulate) takes 16 rows x 16 weights at once, x goes in as two f16 columns (hi, lo: ~22 bits), the
chunk scale rides in the weights (+-g (2 sc + 1) <= 1922 is exact in f16), and the float tail comes
once a block (d) instead of once a chunk. A weight word (4 weights) costs 2 instructions to its
12-bit field's address, one LDS from a 4096-word table of signed grid words (biased bytes), 2 PRMT
into f16 pairs (1024 + byte) and 2 HFMA2 (the bias off, the scale on): 7 against ~10 with dp4a.

Layout (made up here from random fields; a real repack from IQ3_XXS blocks comes if this wins): bands
of 16 rows, a record of 1632 bytes a band and block of 256 columns: [3 planes x 32 lanes x 16 bytes:
lane 4g+q's 32 fields of 12 bits, field 4c+k: chunk c, k = 0: (row g, word q), 1: (row g+8, word q),
2: (row g, word q+4), 3: (row g+8, word q+4)][8 x (scale word of row g, of row g+8)][8 x (d_g, d_g+8)].

Prints the max relative error against float64 and the time a product (CUDA graph of launches cycling
4 weight copies, past the L2), per (warps a CTA, bands a CTA).
"""
import sys

import cupy as cp
import numpy as np

from lite.kernels import iq_tables, pdl

SRC = r"""
__device__ const unsigned GRID[256] = {GRID_VALUES};
__device__ const unsigned LUT[32] = {LUT_VALUES};
__device__ const unsigned TAB4096[4096] __attribute__((aligned(16))) = {TAB_VALUES};
__device__ __forceinline__ unsigned fma2(unsigned a, unsigned b, unsigned c) {
    unsigned d; asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
}
__device__ __forceinline__ unsigned pack2(float lo, float hi) {   // f16x2 (lo in the low half)
    unsigned d; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d;
}
__device__ __forceinline__ float2 unpack2(unsigned v) {
    float lo, hi;
    asm("{.reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h;}" : "=f"(lo), "=f"(hi) : "r"(v));
    return make_float2(lo, hi);
}
__device__ __forceinline__ void mma(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, uint2 b) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}
struct Rec { uint4 f[3]; uint2 sc; unsigned d; };
__device__ __forceinline__ void load_rec(Rec& r, const unsigned char* rec, int lane) {
    #pragma unroll
    for (int p = 0; p < 3; p++) r.f[p] = __ldg((const uint4*)(rec + 512 * p) + lane);
    r.sc = __ldg((const uint2*)(rec + 1536) + (lane >> 2));
    r.d = __ldg((const unsigned*)(rec + 1600) + (lane >> 2));
}
__device__ __forceinline__ unsigned word_of(const Rec& r, int i) {
    const uint4 v = r.f[i >> 2];
    return (i & 3) == 0 ? v.x : (i & 3) == 1 ? v.y : (i & 3) == 2 ? v.z : v.w;
}
// field n's byte offset in the table: (field << 2) & 0x3FFC (n a constant after unrolling)
__device__ __forceinline__ unsigned field_off(const Rec& r, int n) {
    const int bit = 12 * n, wi = bit >> 5, sh = bit & 31;
    if (sh <= 20) {
        if (sh >= 2) return (word_of(r, wi) >> (sh - 2)) & 0x3FFCu;
        else return (word_of(r, wi) << (2 - sh)) & 0x3FFCu;
    } else {
        return __funnelshift_r(word_of(r, wi), word_of(r, wi + 1), sh - 2) & 0x3FFCu;
    }
}
template <int W, int NB>
__global__ void __launch_bounds__(32 * W) mvc(const unsigned char* __restrict__ wq, const float* __restrict__ x,
                                              float* __restrict__ out, int rows, int cols) {
    static_assert(W >= 8, "the table fill takes 16 entries a thread");
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned* tab = (unsigned*)smem;                       // 4096 signed grid words (bytes 128 +- g)
    uint2* lut = (uint2*)(smem + 16384);                   // 16 x (s2, -1152 s2), s = 2 sc + 1
    uint2* xf = (uint2*)(smem + 16384 + 128);              // [chunk][half][8 lanes] (b0, b1)
    float* red = (float*)(smem + 16384 + 128 + cols * 4);  // [W][NB * 16]
    const int nblk = cols >> 8, nch = cols >> 5, bands = (rows + 15) >> 4;
    {
        unsigned g[16];
        #pragma unroll
        for (int k = 0; k < 16; k++) g[k] = __ldg(GRID + ((threadIdx.x + k * 32 * W) & 255));
        #pragma unroll
        for (int k = 0; k < 16; k++) {
            const unsigned e = threadIdx.x + k * 32 * W;
            if (e < 4096) {
                unsigned v = 0;
                #pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int gi = (g[k] >> (8 * i)) & 255;
                    v |= (unsigned)(128 + (((e >> (8 + i)) & 1) ? -gi : gi)) << (8 * i);
                }
                tab[e] = v;
            }
        }
        if (threadIdx.x < 32) ((unsigned*)lut)[threadIdx.x] = LUT[threadIdx.x];
    }
    for (int i = threadIdx.x; i < nch * 16; i += 32 * W) {   // x as the mma's B: column 0 hi, column 1 lo
        const int l8 = i & 7, h = (i >> 3) & 1, c = i >> 4, q = l8 & 3;
        const float4 v = __ldg((const float4*)(x + 32 * c + 16 * h + 4 * q));
        unsigned b0 = pack2(v.x, v.y), b1 = pack2(v.z, v.w);
        if (l8 >= 4) {
            const float2 u0 = unpack2(b0), u1 = unpack2(b1);
            b0 = pack2(v.x - u0.x, v.y - u0.y);
            b1 = pack2(v.z - u1.x, v.w - u1.y);
        }
        xf[i] = make_uint2(b0, b1);
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned char* tb = (const unsigned char*)tab;
    const unsigned char* lb = (const unsigned char*)lut;
    float acc[NB][2];
    #pragma unroll
    for (int b = 0; b < NB; b++) acc[b][0] = acc[b][1] = 0.f;
    const unsigned char* base[NB];
    #pragma unroll
    for (int b = 0; b < NB; b++) base[b] = wq + (long long)min(blockIdx.x * NB + b, bands - 1) * nblk * 1632;
    Rec cur[NB], nxt[NB];
    if (warp < nblk) {
        #pragma unroll
        for (int b = 0; b < NB; b++) load_rec(cur[b], base[b] + (long long)warp * 1632, lane);
    }
    for (int j = warp; j < nblk; j += W) {
        if (j + W < nblk) {
            #pragma unroll
            for (int b = 0; b < NB; b++) load_rec(nxt[b], base[b] + (long long)(j + W) * 1632, lane);
        }
        float cc[NB][4];
        #pragma unroll
        for (int b = 0; b < NB; b++) cc[b][0] = cc[b][1] = cc[b][2] = cc[b][3] = 0.f;
        #pragma unroll
        for (int c = 0; c < 8; c++) {
            uint2 xb0 = make_uint2(0, 0), xb1 = make_uint2(0, 0);
            if (lane < 8) {
                xb0 = xf[((j * 8 + c) * 2 + 0) * 8 + lane];
                xb1 = xf[((j * 8 + c) * 2 + 1) * 8 + lane];
            }
            #pragma unroll
            for (int b = 0; b < NB; b++) {
                const unsigned s0 = c == 0 ? (cur[b].sc.x << 3) & 0x78u : (cur[b].sc.x >> (4 * c - 3)) & 0x78u;
                const unsigned s1 = c == 0 ? (cur[b].sc.y << 3) & 0x78u : (cur[b].sc.y >> (4 * c - 3)) & 0x78u;
                const uint2 m0 = *(const uint2*)(lb + s0), m1 = *(const uint2*)(lb + s1);
                const unsigned u0 = *(const unsigned*)(tb + field_off(cur[b], 4 * c + 0));
                const unsigned u1 = *(const unsigned*)(tb + field_off(cur[b], 4 * c + 1));
                const unsigned u2 = *(const unsigned*)(tb + field_off(cur[b], 4 * c + 2));
                const unsigned u3 = *(const unsigned*)(tb + field_off(cur[b], 4 * c + 3));
                mma(cc[b], fma2(__byte_perm(u0, 0x64646464u, 0x4140), m0.x, m0.y),
                           fma2(__byte_perm(u1, 0x64646464u, 0x4140), m1.x, m1.y),
                           fma2(__byte_perm(u0, 0x64646464u, 0x4342), m0.x, m0.y),
                           fma2(__byte_perm(u1, 0x64646464u, 0x4342), m1.x, m1.y), xb0);
                mma(cc[b], fma2(__byte_perm(u2, 0x64646464u, 0x4140), m0.x, m0.y),
                           fma2(__byte_perm(u3, 0x64646464u, 0x4140), m1.x, m1.y),
                           fma2(__byte_perm(u2, 0x64646464u, 0x4342), m0.x, m0.y),
                           fma2(__byte_perm(u3, 0x64646464u, 0x4342), m1.x, m1.y), xb1);
            }
        }
        #pragma unroll
        for (int b = 0; b < NB; b++) {
            const float2 d = unpack2(cur[b].d);
            acc[b][0] = fmaf(d.x, cc[b][0] + cc[b][1], acc[b][0]);
            acc[b][1] = fmaf(d.y, cc[b][2] + cc[b][3], acc[b][1]);
            cur[b] = nxt[b];
        }
    }
    if ((lane & 3) == 0) {
        #pragma unroll
        for (int b = 0; b < NB; b++) {
            red[warp * NB * 16 + b * 16 + (lane >> 2)] = acc[b][0];
            red[warp * NB * 16 + b * 16 + (lane >> 2) + 8] = acc[b][1];
        }
    }
    __syncthreads();
    if (threadIdx.x < NB * 16) {
        float s = 0.f;
        for (int w = 0; w < W; w++) s += red[w * NB * 16 + threadIdx.x];
        const int row = blockIdx.x * NB * 16 + threadIdx.x;
        if (row < rows) out[row] = 0.25f * s;
    }
}
// The int8 form (mvi): the table holds signed bytes +-g (no conversion), x is qx<TIQ3_XXS, 20>'s
// records (hi, lo int8 a run of 16, d_a, sum_a, d_b, sum_b: x = d (254 hi + lo)) as the B columns
// (hi_a, lo_a, hi_b, lo_b), mma.m16n8k32.s8 (16 rows x 32 weights, one chunk) into int32, and the
// chunk's tail (2 sc + 1 as an integer, one I2F, one FFMA a row) on lanes q = 0 (run a) and 1 (run b).
__device__ __forceinline__ void imma(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, uint2 b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y), "r"(0));
}
// One block of 256 columns for NB bands: the 8 chunks' mma and tails into blk, then d into acc.
struct XRec { unsigned w[8]; float d[8]; };   // a block's x words and d for this lane (mvi<.., XP = 1>)
__device__ __forceinline__ void load_x8(XRec& x, const unsigned char* xj, int xo, int dxo) {
    #pragma unroll
    for (int c = 0; c < 8; c++) {
        x.w[c] = __ldg((const unsigned*)(xj + 80 * c + xo));
        x.d[c] = __ldg((const float*)(xj + 80 * c + dxo));
    }
}
template <int NB>
__device__ __forceinline__ void mvi_block(const Rec (&r0)[NB], const unsigned char* tb, const unsigned char* xj,
                                          int xo, int dxo, unsigned m0, unsigned m1, float (&acc)[NB][2], const XRec* xp = nullptr) {
    float blk[NB][2];
    #pragma unroll
    for (int b = 0; b < NB; b++) blk[b][0] = blk[b][1] = 0.f;
    #pragma unroll
    for (int c = 0; c < 8; c++) {
        const unsigned xw = xp ? xp->w[c] : __ldg((const unsigned*)(xj + 80 * c + xo));
        const uint2 xb = make_uint2(xw & m0, xw & m1);
        const float dx = xp ? xp->d[c] : __ldg((const float*)(xj + 80 * c + dxo));
        #pragma unroll
        for (int b = 0; b < NB; b++) {
            int cc[4];
            imma(cc, *(const unsigned*)(tb + field_off(r0[b], 4 * c + 0)), *(const unsigned*)(tb + field_off(r0[b], 4 * c + 1)),
                     *(const unsigned*)(tb + field_off(r0[b], 4 * c + 2)), *(const unsigned*)(tb + field_off(r0[b], 4 * c + 3)), xb);
            const int s0 = (c == 0 ? (r0[b].sc.x << 1) : (r0[b].sc.x >> (4 * c - 1))) & 0x1E;   // 2 sc
            const int s1 = (c == 0 ? (r0[b].sc.y << 1) : (r0[b].sc.y >> (4 * c - 1))) & 0x1E;
            const int t0 = cc[0] * 254 + cc[1], t1 = cc[2] * 254 + cc[3];
            blk[b][0] = fmaf(dx, (float)(t0 * s0 + t0), blk[b][0]);
            blk[b][1] = fmaf(dx, (float)(t1 * s1 + t1), blk[b][1]);
        }
    }
    #pragma unroll
    for (int b = 0; b < NB; b++) {
        const float2 d = unpack2(r0[b].d);
        acc[b][0] = fmaf(d.x, blk[b][0], acc[b][0]);
        acc[b][1] = fmaf(d.y, blk[b][1], acc[b][1]);
    }
}
// Chunk pairs (PR = 1): chunk c's mma with x in B's columns 0-3 (lanes 0-15 hold its words), chunk
// c + 1's into the same accumulators with x in columns 4-7 (lanes 16-31), so that lane q's two sums
// are (chunk c + q / 2, run q % 2): every lane's tail is useful, one tail a pair instead of a chunk.
__device__ __forceinline__ void imma_acc(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, uint2 b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}
template <int NB>
__device__ __forceinline__ void mvi_block2(const Rec (&r0)[NB], const unsigned char* tb, const unsigned char* xj,
                                           int xo, int dxo, unsigned m0, unsigned m1, float (&acc)[NB][2]) {
    const int lane = threadIdx.x & 31, half = lane >> 4, qh = (lane & 3) >> 1;    // qh: this lane's chunk of the pair
    const unsigned ma = half ? 0u : ~0u;
    float blk[NB][2];
    #pragma unroll
    for (int b = 0; b < NB; b++) blk[b][0] = blk[b][1] = 0.f;
    #pragma unroll
    for (int cp = 0; cp < 4; cp++) {
        const int c = 2 * cp;
        const unsigned xw = __ldg((const unsigned*)(xj + 80 * (c + half) + xo));
        const uint2 xb0 = make_uint2(xw & m0 & ma, xw & m1 & ma), xb1 = make_uint2(xw & m0 & ~ma, xw & m1 & ~ma);
        const float dx = __ldg((const float*)(xj + 80 * (c + qh) + dxo));
        #pragma unroll
        for (int b = 0; b < NB; b++) {
            int cc[4];
            imma(cc, *(const unsigned*)(tb + field_off(r0[b], 4 * c + 0)), *(const unsigned*)(tb + field_off(r0[b], 4 * c + 1)),
                     *(const unsigned*)(tb + field_off(r0[b], 4 * c + 2)), *(const unsigned*)(tb + field_off(r0[b], 4 * c + 3)), xb0);
            imma_acc(cc, *(const unsigned*)(tb + field_off(r0[b], 4 * c + 4)), *(const unsigned*)(tb + field_off(r0[b], 4 * c + 5)),
                         *(const unsigned*)(tb + field_off(r0[b], 4 * c + 6)), *(const unsigned*)(tb + field_off(r0[b], 4 * c + 7)), xb1);
            const unsigned scq0 = r0[b].sc.x >> (4 * qh), scq1 = r0[b].sc.y >> (4 * qh);   // this lane's chunk c + qh
            const int s0 = (c == 0 ? (scq0 << 1) : (scq0 >> (4 * c - 1))) & 0x1E;   // 2 sc
            const int s1 = (c == 0 ? (scq1 << 1) : (scq1 >> (4 * c - 1))) & 0x1E;
            const int t0 = cc[0] * 254 + cc[1], t1 = cc[2] * 254 + cc[3];
            blk[b][0] = fmaf(dx, (float)(t0 * s0 + t0), blk[b][0]);
            blk[b][1] = fmaf(dx, (float)(t1 * s1 + t1), blk[b][1]);
        }
    }
    #pragma unroll
    for (int b = 0; b < NB; b++) {
        const float2 d = unpack2(r0[b].d);
        acc[b][0] = fmaf(d.x, blk[b][0], acc[b][0]);
        acc[b][1] = fmaf(d.y, blk[b][1], acc[b][1]);
    }
}
// The end of mvi / mvit: lanes q = 0, 1 (runs a, b) summed, then the warps' sums, 0.25 for (2 sc + 1) / 4.
template <int W, int NB>
__device__ __forceinline__ void mvi_finish(float (&acc)[NB][2], float* red, float* __restrict__ out, int rows) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    #pragma unroll
    for (int b = 0; b < NB; b++) {
        acc[b][0] += __shfl_xor_sync(0xffffffffu, acc[b][0], 1);
        acc[b][1] += __shfl_xor_sync(0xffffffffu, acc[b][1], 1);
        acc[b][0] += __shfl_xor_sync(0xffffffffu, acc[b][0], 2);
        acc[b][1] += __shfl_xor_sync(0xffffffffu, acc[b][1], 2);
    }
    if ((lane & 3) == 0) {
        #pragma unroll
        for (int b = 0; b < NB; b++) {
            red[warp * NB * 16 + b * 16 + (lane >> 2)] = acc[b][0];
            red[warp * NB * 16 + b * 16 + (lane >> 2) + 8] = acc[b][1];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NB * 16; i += 32 * W) {
        float s = 0.f;
        for (int w = 0; w < W; w++) s += red[w * NB * 16 + i];
        const int row = blockIdx.x * NB * 16 + i;
        if (row < rows) out[row] = 0.25f * s;
    }
}
template <int W, int NB, int P, int XP = 0, int PR = 0>   // P: blocks a warp has loaded ahead (1 or 2); XP: x's words with them; PR: chunk pairs
__global__ void __launch_bounds__(32 * W, NB == 1 ? 2 : 1) mvi(const unsigned char* __restrict__ wq, const unsigned char* __restrict__ xr,
                                              float* __restrict__ out, int rows, int cols) {
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned* tab = (unsigned*)smem;                       // 4096 signed grid words (bytes +-g): TAB4096's copy
    float* red = (float*)(smem + 16384);                   // [W][NB * 16]
    const int nblk = cols >> 8, bands = (rows + 15) >> 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
    const unsigned char* base[NB];
    #pragma unroll
    for (int b = 0; b < NB; b++) base[b] = wq + (long long)min(blockIdx.x * NB + b, bands - 1) * nblk * 1632;
    Rec rr[P + 1][NB];            // blocks j, j + W, ..., j + P W
    #pragma unroll
    for (int k = 0; k < P; k++)     // the weights do not depend on the previous kernel: before the PDL wait
        #pragma unroll
        for (int b = 0; b < NB; b++)
            if (warp + k * W < nblk) load_rec(rr[k][b], base[b] + (long long)(warp + k * W) * 1632, lane);
    {
        uint4 t[(1024 + 32 * W - 1) / (32 * W)];
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * W - 1) / (32 * W); k++)
            if (threadIdx.x + k * 32 * W < 1024) t[k] = __ldg((const uint4*)TAB4096 + threadIdx.x + k * 32 * W);
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * W - 1) / (32 * W); k++)
            if (threadIdx.x + k * 32 * W < 1024) ((uint4*)tab)[threadIdx.x + k * 32 * W] = t[k];
    }
    __syncthreads();
    PDL_PROLOGUE();
    const unsigned char* tb = (const unsigned char*)tab;
    // this lane's B word in a chunk's record (column gq: hi_a, lo_a, hi_b, lo_b); lanes 16-31 read lane
    // - 16's and keep zeros (m0, m1: the word is b0, b1 or neither), and its run's d (q = 0: a, 1: b)
    const int xo = ((gq & 1) * 32 + ((gq >> 1) & 1) * 16 + 4 * q), dxo = 64 + 8 * (q & 1);
    const int xo2 = ((gq & 1) * 32 + ((gq >> 1) & 1) * 16 + 4 * q);   // PR: lanes 16-31 the same columns of chunk c + 1
    const unsigned m0 = lane < 16 && !(gq & 2) ? ~0u : 0u, m1 = lane < 16 && (gq & 2) ? ~0u : 0u;
    float acc[NB][2];
    #pragma unroll
    for (int b = 0; b < NB; b++) acc[b][0] = acc[b][1] = 0.f;
    XRec x0, x1;
    if (XP && warp < nblk) load_x8(x0, xr + (long long)warp * 640, xo, dxo);
    for (int j = warp; j < nblk; j += W) {
        const int jn = j + P * W;
        if (jn < nblk) {
            #pragma unroll
            for (int b = 0; b < NB; b++) load_rec(rr[P][b], base[b] + (long long)jn * 1632, lane);
        }
        const Rec (&r0)[NB] = rr[0];
        if (XP) {
            if (j + W < nblk) load_x8(x1, xr + (long long)(j + W) * 640, xo, dxo);
            mvi_block<NB>(r0, tb, nullptr, xo, dxo, m0, m1, acc, &x0);
            x0 = x1;
        } else if (PR) {
            mvi_block2<NB>(r0, tb, xr + (long long)j * 640, xo2, dxo, (gq & 2) ? 0u : ~0u, (gq & 2) ? ~0u : 0u, acc);
        } else {
            mvi_block<NB>(r0, tb, xr + (long long)j * 640, xo, dxo, m0, m1, acc);
        }
        #pragma unroll
        for (int k = 0; k < P; k++)
            #pragma unroll
            for (int b = 0; b < NB; b++) rr[k][b] = rr[k + 1][b];
    }
    mvi_finish<W, NB>(acc, red, out, rows);
}
// mvs: mvi without bank conflicts (session 12, call 7: Nsight found mvi's 4096-word table lookups at
// 3.5-way bank conflicts, 1.65M shared wavefronts, L1 ~94% busy in the graph). The grid's 256 unsigned
// words in 32 copies, copy l in bank l (lane l reads its own), the signs put on by XOR with a byte mask
// (g ^ m: g or -g - 1) and taken back by a second mma of the masks against -x (sum (g^m) x - sum m x).
// Layout: a record of 1632 bytes a band and block: [2 planes x 32 lanes x 16 bytes: lane 4g+q's 32
// grid indices, chunk c's 4 in word c of the lane's 8 (byte k: field k as mvi's)][32 lanes x 16 bytes:
// signs, field n = 4c + k in word n / 8 at bits j, j + 8, j + 16, j + 24 (j = n % 8)][scales][d].
struct SRec { uint4 ix[2]; uint4 s; uint2 sc; unsigned d; };
__device__ __forceinline__ void load_srec(SRec& r, const unsigned char* rec, int lane) {
    r.ix[0] = __ldg((const uint4*)rec + lane);
    r.ix[1] = __ldg((const uint4*)(rec + 512) + lane);
    r.s = __ldg((const uint4*)(rec + 1024) + lane);
    r.sc = __ldg((const uint2*)(rec + 1536) + (lane >> 2));
    r.d = __ldg((const unsigned*)(rec + 1600) + (lane >> 2));
}
__device__ __forceinline__ unsigned u4(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
__device__ __forceinline__ unsigned topmask(unsigned v) { unsigned m; asm("prmt.b32 %0, %1, 0, 0xBA98;" : "=r"(m) : "r"(v)); return m; }
template <int W, int NB, int P>
__global__ void __launch_bounds__(32 * W, NB == 1 ? 2 : 1) mvs(const unsigned char* __restrict__ wq, const unsigned char* __restrict__ xr,
                                                               float* __restrict__ out, int rows, int cols) {
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned* tab = (unsigned*)smem;                       // [256 entries][32 copies]
    float* red = (float*)(smem + 32768);
    const int nblk = cols >> 8, bands = (rows + 15) >> 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
    const unsigned char* base[NB];
    #pragma unroll
    for (int b = 0; b < NB; b++) base[b] = wq + (long long)min(blockIdx.x * NB + b, bands - 1) * nblk * 1632;
    SRec rr[P + 1][NB];
    #pragma unroll
    for (int k = 0; k < P; k++)
        #pragma unroll
        for (int b = 0; b < NB; b++)
            if (warp + k * W < nblk) load_srec(rr[k][b], base[b] + (long long)(warp + k * W) * 1632, lane);
    {   // entry e's 32 copies as 8 16-byte stores, lane l starting at store l % 8 (4 wavefronts a warp's store)
        unsigned g[2];
        #pragma unroll
        for (int k = 0; k < 2; k++) g[k] = threadIdx.x + k * 32 * W < 256 ? __ldg(GRID + threadIdx.x + k * 32 * W) : 0u;
        #pragma unroll
        for (int k = 0; k < 2; k++) {
            const unsigned e = threadIdx.x + k * 32 * W;
            if (e < 256)
                #pragma unroll
                for (int j = 0; j < 8; j++) ((uint4*)tab)[e * 8 + ((j + threadIdx.x) & 7)] = make_uint4(g[k], g[k], g[k], g[k]);
        }
    }
    __syncthreads();
    PDL_PROLOGUE();
    const unsigned char* tb = (const unsigned char*)tab + 4 * lane;
    const int half = lane >> 4, qh = q >> 1;
    const int xo = ((gq & 1) * 32 + ((gq >> 1) & 1) * 16 + 4 * q), dxo = 64 + 8 * (q & 1);
    const unsigned ma = half ? 0u : ~0u, m0 = (gq & 2) ? 0u : ~0u, m1 = ~m0;
    float acc[NB][2];
    #pragma unroll
    for (int b = 0; b < NB; b++) acc[b][0] = acc[b][1] = 0.f;
    for (int j = warp; j < nblk; j += W) {
        const int jn = j + P * W;
        if (jn < nblk) {
            #pragma unroll
            for (int b = 0; b < NB; b++) load_srec(rr[P][b], base[b] + (long long)jn * 1632, lane);
        }
        const unsigned char* xj = xr + (long long)j * 640;
        float blk[NB][2];
        #pragma unroll
        for (int b = 0; b < NB; b++) blk[b][0] = blk[b][1] = 0.f;
        #pragma unroll
        for (int cp = 0; cp < 4; cp++) {   // chunk pairs (mvi's PR)
            const int c = 2 * cp;
            const unsigned xw = __ldg((const unsigned*)(xj + 80 * (c + half) + xo));
            const unsigned xn = __vsub4(0u, xw);
            const uint2 xb0 = make_uint2(xw & m0 & ma, xw & m1 & ma), xb1 = make_uint2(xw & m0 & ~ma, xw & m1 & ~ma);
            const uint2 nb0 = make_uint2(xn & m0 & ma, xn & m1 & ma), nb1 = make_uint2(xn & m0 & ~ma, xn & m1 & ~ma);
            const float dx = __ldg((const float*)(xj + 80 * (c + qh) + dxo));
            #pragma unroll
            for (int b = 0; b < NB; b++) {
                const SRec& r = rr[0][b];
                unsigned a[8], m[8];
                #pragma unroll
                for (int t = 0; t < 8; t++) {     // fields 4c + t (t < 4: chunk c, else chunk c + 1)
                    const int n = 4 * c + t, cc2 = n >> 2, k = n & 3;
                    const unsigned iw = u4(r.ix[cc2 >> 2], cc2 & 3);
                    const unsigned idx = k == 0 ? (iw & 255u) : k == 3 ? (iw >> 24) : ((iw >> (8 * k)) & 255u);
                    const unsigned g = *(const unsigned*)(tb + idx * 128);
                    m[t] = topmask(u4(r.s, n >> 3) << (7 - (n & 7)));
                    a[t] = g ^ m[t];
                }
                int cc[4];
                imma(cc, a[0], a[1], a[2], a[3], xb0);
                imma_acc(cc, m[0], m[1], m[2], m[3], nb0);
                imma_acc(cc, a[4], a[5], a[6], a[7], xb1);
                imma_acc(cc, m[4], m[5], m[6], m[7], nb1);
                const unsigned scq0 = r.sc.x >> (4 * qh), scq1 = r.sc.y >> (4 * qh);
                const int s0 = (c == 0 ? (scq0 << 1) : (scq0 >> (4 * c - 1))) & 0x1E;
                const int s1 = (c == 0 ? (scq1 << 1) : (scq1 >> (4 * c - 1))) & 0x1E;
                const int t0 = cc[0] * 254 + cc[1], t1 = cc[2] * 254 + cc[3];
                blk[b][0] = fmaf(dx, (float)(t0 * s0 + t0), blk[b][0]);
                blk[b][1] = fmaf(dx, (float)(t1 * s1 + t1), blk[b][1]);
            }
        }
        #pragma unroll
        for (int b = 0; b < NB; b++) {
            const float2 d = unpack2(rr[0][b].d);
            acc[b][0] = fmaf(d.x, blk[b][0], acc[b][0]);
            acc[b][1] = fmaf(d.y, blk[b][1], acc[b][1]);
        }
        #pragma unroll
        for (int k = 0; k < P; k++)
            #pragma unroll
            for (int b = 0; b < NB; b++) rr[k][b] = rr[k + 1][b];
    }
    mvi_finish<W, NB>(acc, red, out, rows);
}
// mvx: half the lookups conflict-free (call 17: mvi's L1 ~95% busy with the 4096-word table's 3.5-way
// conflicts, issue 33%): of each chunk pair, chunk c as mvi (12-bit field -> signed table), chunk c + 1
// as mvs (grid index -> the unsigned grid's 32 copies, lane l's in bank l; signs by XOR and a second mma
// against -x). A lane's 12 words: 0-5 the even chunks' 16 fields of 12 bits (4 (c / 2) + k), 6-9 the
// odd chunks' grid indices (word 6 + c / 2, byte k), 10-11 their signs (field n = 4 (c / 2) + k at bits
// n % 8 + 8t of word 10 + n / 8).
template <int W, int P>
__global__ void __launch_bounds__(32 * W, 2) mvx(const unsigned char* __restrict__ wq, const unsigned char* __restrict__ xr,
                                                 float* __restrict__ out, int rows, int cols) {
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned* tab = (unsigned*)smem;                       // 4096 signed grid words
    unsigned* g32 = (unsigned*)(smem + 16384);             // [256 entries][32 copies]
    float* red = (float*)(smem + 49152);
    const int nblk = cols >> 8, bands = (rows + 15) >> 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
    const unsigned char* base = wq + (long long)min((int)blockIdx.x, bands - 1) * nblk * 1632;
    Rec rr[P + 1];
    #pragma unroll
    for (int k = 0; k < P; k++)
        if (warp + k * W < nblk) load_rec(rr[k], base + (long long)(warp + k * W) * 1632, lane);
    {
        uint4 t[(1024 + 32 * W - 1) / (32 * W)];
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * W - 1) / (32 * W); k++)
            if (threadIdx.x + k * 32 * W < 1024) t[k] = __ldg((const uint4*)TAB4096 + threadIdx.x + k * 32 * W);
        unsigned g[2];
        #pragma unroll
        for (int k = 0; k < 2; k++) g[k] = threadIdx.x + k * 32 * W < 256 ? __ldg(GRID + threadIdx.x + k * 32 * W) : 0u;
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * W - 1) / (32 * W); k++)
            if (threadIdx.x + k * 32 * W < 1024) ((uint4*)tab)[threadIdx.x + k * 32 * W] = t[k];
        #pragma unroll
        for (int k = 0; k < 2; k++) {
            const unsigned e = threadIdx.x + k * 32 * W;
            if (e < 256)
                #pragma unroll
                for (int j = 0; j < 8; j++) ((uint4*)g32)[e * 8 + ((j + threadIdx.x) & 7)] = make_uint4(g[k], g[k], g[k], g[k]);
        }
    }
    __syncthreads();
    PDL_PROLOGUE();
    const unsigned char* tb = (const unsigned char*)tab;
    const unsigned char* gb = (const unsigned char*)g32 + 4 * lane;
    const int half = lane >> 4, qh = q >> 1;
    const int xo = ((gq & 1) * 32 + ((gq >> 1) & 1) * 16 + 4 * q), dxo = 64 + 8 * (q & 1);
    const unsigned ma = half ? 0u : ~0u, m0 = (gq & 2) ? 0u : ~0u, m1 = ~m0;
    float acc0 = 0.f, acc1 = 0.f;
    for (int j = warp; j < nblk; j += W) {
        if (j + P * W < nblk) load_rec(rr[P], base + (long long)(j + P * W) * 1632, lane);
        const Rec& r = rr[0];
        const unsigned char* xj = xr + (long long)j * 640;
        float blk0 = 0.f, blk1 = 0.f;
        #pragma unroll
        for (int cp = 0; cp < 4; cp++) {
            const int c = 2 * cp;
            const unsigned v = __ldg((const unsigned*)(xj + 80 * (c + half) + xo));
            const unsigned vn = __vsub4(0u, v);
            const float dx = __ldg((const float*)(xj + 80 * (c + qh) + dxo));
            int cc[4];
            imma(cc, *(const unsigned*)(tb + field_off(r, 4 * cp + 0)), *(const unsigned*)(tb + field_off(r, 4 * cp + 1)),
                     *(const unsigned*)(tb + field_off(r, 4 * cp + 2)), *(const unsigned*)(tb + field_off(r, 4 * cp + 3)),
                     make_uint2(v & m0 & ma, v & m1 & ma));
            unsigned a[4], m[4];
            const unsigned iw = word_of(r, 6 + cp);
            #pragma unroll
            for (int k = 0; k < 4; k++) {
                const int n = 4 * cp + k;
                const unsigned idx = k == 0 ? (iw & 255u) : k == 3 ? (iw >> 24) : ((iw >> (8 * k)) & 255u);
                const unsigned g = *(const unsigned*)(gb + idx * 128);
                m[k] = topmask(word_of(r, 10 + (n >> 3)) << (7 - (n & 7)));
                a[k] = g ^ m[k];
            }
            imma_acc(cc, a[0], a[1], a[2], a[3], make_uint2(v & m0 & ~ma, v & m1 & ~ma));
            imma_acc(cc, m[0], m[1], m[2], m[3], make_uint2(vn & m0 & ~ma, vn & m1 & ~ma));
            const unsigned s0q = r.sc.x >> (4 * qh), s1q = r.sc.y >> (4 * qh);
            const int s0 = (c == 0 ? (s0q << 1) : (s0q >> (4 * c - 1))) & 0x1E;
            const int s1 = (c == 0 ? (s1q << 1) : (s1q >> (4 * c - 1))) & 0x1E;
            const int t0 = cc[0] * 254 + cc[1], t1 = cc[2] * 254 + cc[3];
            blk0 = fmaf(dx, (float)(t0 * s0 + t0), blk0);
            blk1 = fmaf(dx, (float)(t1 * s1 + t1), blk1);
        }
        const float2 d = unpack2(r.d);
        acc0 = fmaf(d.x, blk0, acc0);
        acc1 = fmaf(d.y, blk1, acc1);
        #pragma unroll
        for (int k = 0; k < P; k++) rr[k] = rr[k + 1];
    }
    float acc[1][2] = {{acc0, acc1}};
    mvi_finish<W, 1>(acc, red, out, rows);
}
// mvh: mvi over half blocks (4 chunks: the units a warp takes, so that 112 of them share out evenly
// over 16 warps at 14336 columns, where 56 blocks gave 3 or 4 a warp and Nsight found ~20% of the stall
// samples at the closing barrier), x's words and d loaded with the weights, P units ahead.
struct HRec { unsigned w[6]; uint2 sc; unsigned d; unsigned xw[4]; float dx[4]; };
__device__ __forceinline__ unsigned hfield_off(const HRec& r, int n) {
    const int bit = 12 * n, wi = bit >> 5, sh = bit & 31;
    if (sh <= 20) {
        if (sh >= 2) return (r.w[wi] >> (sh - 2)) & 0x3FFCu;
        else return (r.w[wi] << (2 - sh)) & 0x3FFCu;
    }
    return __funnelshift_r(r.w[wi], r.w[wi + 1], sh - 2) & 0x3FFCu;
}
__device__ __forceinline__ void load_half(HRec& r, const unsigned char* rec, int h, const unsigned char* xh, int lane, int xo, int dxo) {
    // words 6h..6h+5 of the lane's 12: h = 0 plane 0 and plane 1's x, y; h = 1 plane 1's z, w and plane 2
    const uint4 a = __ldg((const uint4*)(rec + 1024 * h) + lane);
    const uint2 b = __ldg((const uint2*)(rec + 512 + 16 * lane + 8 * h));
    if (h == 0) { r.w[0] = a.x; r.w[1] = a.y; r.w[2] = a.z; r.w[3] = a.w; r.w[4] = b.x; r.w[5] = b.y; }
    else { r.w[0] = b.x; r.w[1] = b.y; r.w[2] = a.x; r.w[3] = a.y; r.w[4] = a.z; r.w[5] = a.w; }
    const uint2 sc = __ldg((const uint2*)(rec + 1536) + (lane >> 2));
    r.sc = make_uint2(sc.x >> (16 * h), sc.y >> (16 * h));
    r.d = __ldg((const unsigned*)(rec + 1600) + (lane >> 2));
    #pragma unroll
    for (int c4 = 0; c4 < 4; c4++) {
        r.xw[c4] = __ldg((const unsigned*)(xh + 80 * c4 + xo));
        r.dx[c4] = __ldg((const float*)(xh + 80 * c4 + dxo));
    }
}
template <int W, int NB, int P>
__global__ void __launch_bounds__(32 * W) mvh(const unsigned char* __restrict__ wq, const unsigned char* __restrict__ xr,
                                              float* __restrict__ out, int rows, int cols) {
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned* tab = (unsigned*)smem;
    float* red = (float*)(smem + 16384);
    const int nblk = cols >> 8, units = 2 * nblk, bands = (rows + 15) >> 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
    const int xo = ((gq & 1) * 32 + ((gq >> 1) & 1) * 16 + 4 * q), dxo = 64 + 8 * (q & 1);
    const unsigned m0 = lane < 16 && !(gq & 2) ? ~0u : 0u, m1 = lane < 16 && (gq & 2) ? ~0u : 0u;
    const unsigned char* base[NB];
    #pragma unroll
    for (int b = 0; b < NB; b++) base[b] = wq + (long long)min(blockIdx.x * NB + b, bands - 1) * nblk * 1632;
    {
        uint4 t[(1024 + 32 * W - 1) / (32 * W)];
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * W - 1) / (32 * W); k++)
            if (threadIdx.x + k * 32 * W < 1024) t[k] = __ldg((const uint4*)TAB4096 + threadIdx.x + k * 32 * W);
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * W - 1) / (32 * W); k++)
            if (threadIdx.x + k * 32 * W < 1024) ((uint4*)tab)[threadIdx.x + k * 32 * W] = t[k];
    }
    __syncthreads();
    PDL_PROLOGUE();                                        // (x's words ride with the weights: after the wait)
    HRec r0[NB], r1[NB], r2[NB];
    #pragma unroll
    for (int b = 0; b < NB; b++) {
        if (warp < units) load_half(r0[b], base[b] + (warp >> 1) * 1632, warp & 1, xr + (long long)warp * 320, lane, xo, dxo);
        if (P == 2 && warp + W < units)
            load_half(r1[b], base[b] + ((warp + W) >> 1) * 1632, (warp + W) & 1, xr + (long long)(warp + W) * 320, lane, xo, dxo);
    }
    const unsigned char* tb = (const unsigned char*)tab;
    float acc[NB][2];
    #pragma unroll
    for (int b = 0; b < NB; b++) acc[b][0] = acc[b][1] = 0.f;
    for (int u = warp; u < units; u += W) {
        const int un = u + P * W;
        if (un < units) {
            #pragma unroll
            for (int b = 0; b < NB; b++)
                load_half(P == 2 ? r2[b] : r1[b], base[b] + (un >> 1) * 1632, un & 1, xr + (long long)un * 320, lane, xo, dxo);
        }
        #pragma unroll
        for (int b = 0; b < NB; b++) {
            float blk0 = 0.f, blk1 = 0.f;
            #pragma unroll
            for (int c = 0; c < 4; c++) {
                int cc[4];
                const uint2 xb = make_uint2(r0[b].xw[c] & m0, r0[b].xw[c] & m1);
                imma(cc, *(const unsigned*)(tb + hfield_off(r0[b], 4 * c + 0)), *(const unsigned*)(tb + hfield_off(r0[b], 4 * c + 1)),
                         *(const unsigned*)(tb + hfield_off(r0[b], 4 * c + 2)), *(const unsigned*)(tb + hfield_off(r0[b], 4 * c + 3)), xb);
                const int s0 = (c == 0 ? (r0[b].sc.x << 1) : (r0[b].sc.x >> (4 * c - 1))) & 0x1E;
                const int s1 = (c == 0 ? (r0[b].sc.y << 1) : (r0[b].sc.y >> (4 * c - 1))) & 0x1E;
                const int t0 = cc[0] * 254 + cc[1], t1 = cc[2] * 254 + cc[3];
                blk0 = fmaf(r0[b].dx[c], (float)(t0 * s0 + t0), blk0);
                blk1 = fmaf(r0[b].dx[c], (float)(t1 * s1 + t1), blk1);
            }
            const float2 d = unpack2(r0[b].d);
            acc[b][0] = fmaf(d.x, blk0, acc[b][0]);
            acc[b][1] = fmaf(d.y, blk1, acc[b][1]);
            r0[b] = r1[b];
            if (P == 2) r1[b] = r2[b];
        }
    }
    mvi_finish<W, NB>(acc, red, out, rows);
}
// mvit: mvi with the CTA's bands copied whole into shared memory by bulk copies (TMA), all issued before
// the PDL wait, a barrier a round of W blocks (kernels/matvec_tma.py's way: session 11 found its loads
// hidden completely and its per-thread compute the wall; here the compute is mvi's).
__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
template <int W, int NB>
__global__ void __launch_bounds__(32 * W, 1) mvit(const unsigned char* __restrict__ wq, const unsigned char* __restrict__ xr,
                                                  float* __restrict__ out, int rows, int cols) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar[16];
    __shared__ float red[W * NB * 16];
    unsigned* tab = (unsigned*)smem;
    unsigned char* rs = smem + 16384;                      // [NB][nblk][1632]
    const int nblk = cols >> 8, bands = (rows + 15) >> 4, rounds = (nblk + W - 1) / W;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
    if (threadIdx.x == 0) {
        for (int r = 0; r < rounds; r++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sa(bar + r)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
        for (int r = 0; r < rounds; r++) {
            const unsigned n = min(W, nblk - r * W) * 1632;
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(sa(bar + r)), "r"(NB * n) : "memory");
            for (int b = 0; b < NB; b++) {
                const unsigned char* src = wq + ((long long)min(blockIdx.x * NB + b, bands - 1) * nblk + r * W) * 1632;
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             :: "r"(sa(rs + (b * nblk + r * W) * 1632)), "l"(src), "r"(n), "r"(sa(bar + r)) : "memory");
            }
        }
    }
    {
        uint4 t[(1024 + 32 * W - 1) / (32 * W)];
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * W - 1) / (32 * W); k++)
            if (threadIdx.x + k * 32 * W < 1024) t[k] = __ldg((const uint4*)TAB4096 + threadIdx.x + k * 32 * W);
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * W - 1) / (32 * W); k++)
            if (threadIdx.x + k * 32 * W < 1024) ((uint4*)tab)[threadIdx.x + k * 32 * W] = t[k];
    }
    __syncthreads();
    PDL_PROLOGUE();
    const unsigned char* tb = (const unsigned char*)tab;
    const int xo = ((gq & 1) * 32 + ((gq >> 1) & 1) * 16 + 4 * q), dxo = 64 + 8 * (q & 1);
    const unsigned m0 = lane < 16 && !(gq & 2) ? ~0u : 0u, m1 = lane < 16 && (gq & 2) ? ~0u : 0u;
    float acc[NB][2];
    #pragma unroll
    for (int b = 0; b < NB; b++) acc[b][0] = acc[b][1] = 0.f;
    for (int j = warp, r = 0; j < nblk; j += W, r++) {
        asm volatile("{\n\t.reg .pred p;\n\tLT_WAIT%=:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n\t"
                     "@!p bra LT_WAIT%=;\n\t}" :: "r"(sa(bar + r)) : "memory");
        Rec r0[NB];
        #pragma unroll
        for (int b = 0; b < NB; b++) {
            const unsigned char* rec = rs + (b * nblk + j) * 1632;
            #pragma unroll
            for (int p = 0; p < 3; p++) r0[b].f[p] = *((const uint4*)(rec + 512 * p) + lane);
            r0[b].sc = *((const uint2*)(rec + 1536) + gq);
            r0[b].d = *((const unsigned*)(rec + 1600) + gq);
        }
        mvi_block<NB>(r0, tb, xr + (long long)j * 640, xo, dxo, m0, m1, acc);
    }
    mvi_finish<W, NB>(acc, red, out, rows);
}
"""


def grid_words():
    g = iq_tables.grid_values("IQ3_XXS").astype(np.uint32)
    return g[:, 0] | g[:, 1] << 8 | g[:, 2] << 16 | g[:, 3] << 24


def tab_words():
    """The 4096 signed grid words: entry idx | signs << 8, byte i = +-grid[idx][i] (sign bit i)."""
    g = iq_tables.grid_values("IQ3_XXS").astype(np.int64)
    e = np.arange(4096)
    v = np.where((e[:, None] >> (8 + np.arange(4))) & 1, -g[e & 255], g[e & 255]) & 255
    return (v[:, 0] | v[:, 1] << 8 | v[:, 2] << 16 | v[:, 3] << 24).astype(np.uint32)


def lut_words():
    out = []
    for n in range(16):
        s = np.float16(2 * n + 1)
        c = np.float16(-1152.0 * (2 * n + 1))
        sb, cb = int(s.view(np.uint16)), int(c.view(np.uint16))
        out += [sb | sb << 16, cb | cb << 16]
    return out


def make(rows, cols, rng, signed_layout=False, hybrid=False):
    """Random fields -> (records uint8, dense float64 weights); signed_layout: mvs's records; hybrid: mvx's."""
    bands, nblk = rows // 16, cols // 256
    idx = rng.integers(0, 256, (rows, cols // 4))
    sg = rng.integers(0, 16, (rows, cols // 4))
    sc = rng.integers(0, 16, (rows, cols // 32))
    d = (rng.standard_normal((rows, nblk)) * 1e-3).astype(np.float16)
    grid = iq_tables.grid_values("IQ3_XXS").astype(np.float64)
    wv = grid[idx] * np.where((sg[..., None] >> np.arange(4)) & 1, -1.0, 1.0)      # (rows, cols/4, 4)
    wv = wv.reshape(rows, cols // 32, 32) * (2 * sc[..., None] + 1)
    wv = wv.reshape(rows, nblk, 256) * d.astype(np.float64)[..., None] / 4
    dense = wv.reshape(rows, cols)
    field = (idx | sg << 8).astype(np.uint64).reshape(bands, 16, nblk, 8, 8)     # band, row16, block, chunk, word
    lanes = np.arange(32)
    g, q = lanes >> 2, lanes & 3
    F = np.zeros((bands, nblk, 32, 32), np.uint64)                                  # band, block, lane, field
    for c in range(8):
        for k in range(4):
            rr = g + 8 * (k & 1)
            ww = q + 4 * (k >> 1)
            F[:, :, :, 4 * c + k] = field[:, rr, :, c, ww].transpose(1, 2, 0)   # (advanced indices first)
    if signed_layout:
        idx8 = (F & np.uint64(255)).astype(np.uint8)                                 # band, block, lane, n
        planes = np.ascontiguousarray(idx8.reshape(bands, nblk, 32, 2, 16).transpose(0, 1, 3, 2, 4)).reshape(bands, nblk, 1024)
        sgF = (F >> np.uint64(8)).astype(np.uint32)
        S = np.zeros((bands, nblk, 32, 4), np.uint32)
        for n in range(32):
            for t in range(4):
                S[..., n >> 3] |= ((sgF[..., n] >> np.uint32(t)) & np.uint32(1)) << np.uint32((n & 7) + 8 * t)
        planes = np.concatenate([planes.view(np.uint32), S.reshape(bands, nblk, 128)], axis=2)   # 256 + 128 words
    W = np.zeros((bands, nblk, 32, 12), np.uint64)
    if hybrid:                                      # even chunks as 12-bit fields, odd as index bytes and signs
        for cp in range(4):
            for k in range(4):
                n = 4 * cp + k
                fe, fo = F[..., 4 * (2 * cp) + k], F[..., 4 * (2 * cp + 1) + k]
                bit = 12 * n
                wi, sh = bit >> 5, bit & 31
                W[..., wi] |= (fe << np.uint64(sh)) & np.uint64(0xFFFFFFFF)
                if sh > 20:
                    W[..., wi + 1] |= fe >> np.uint64(32 - sh)
                W[..., 6 + cp] |= (fo & np.uint64(255)) << np.uint64(8 * k)
                for t in range(4):
                    W[..., 10 + (n >> 3)] |= ((fo >> np.uint64(8 + t)) & np.uint64(1)) << np.uint64((n & 7) + 8 * t)
    for n in range(0 if signed_layout or hybrid else 32):
        bit = 12 * n
        wi, sh = bit >> 5, bit & 31
        W[..., wi] |= (F[..., n] << np.uint64(sh)) & np.uint64(0xFFFFFFFF)
        if sh > 20:
            W[..., wi + 1] |= F[..., n] >> np.uint64(32 - sh)
    if not signed_layout:
        W32 = W.astype(np.uint32)                                                   # band, block, lane, 12
        planes = W32.reshape(bands, nblk, 32, 3, 4).transpose(0, 1, 3, 2, 4).reshape(bands, nblk, 1536 // 4)
    scw = np.zeros((rows, nblk), np.uint32)
    scr = sc.reshape(rows, nblk, 8).astype(np.uint32)
    for c in range(8):
        scw |= scr[..., c] << np.uint32(4 * c)
    scw = scw.reshape(bands, 16, nblk).transpose(0, 2, 1)                           # band, block, row16
    sc_part = np.stack([scw[..., :8], scw[..., 8:]], axis=-1).reshape(bands, nblk, 16)
    dh = d.view(np.uint16).astype(np.uint32).reshape(bands, 16, nblk).transpose(0, 2, 1)
    d_part = (dh[..., :8] | dh[..., 8:] << 16)
    rec = np.concatenate([planes, sc_part, d_part], axis=2).astype(np.uint32)       # 384 + 16 + 8 words
    assert rec.shape[2] * 4 == 1632
    return rec.reshape(-1).view(np.uint8), dense


def x_records(cols, rng):
    """x as qx<TIQ3_XXS, 20>'s records (hi, lo int8, d_a, sum_a, d_b, sum_b a chunk of 32), and its floats."""
    nch = cols // 32
    hi = rng.integers(-127, 128, (nch, 32)).astype(np.int8)
    lo = rng.integers(-127, 128, (nch, 32)).astype(np.int8)
    d = (np.abs(rng.standard_normal((nch, 2))) * 1e-4 + 1e-5).astype(np.float32)
    xf = (d[:, :, None].astype(np.float64) * (254.0 * hi.reshape(nch, 2, 16) + lo.reshape(nch, 2, 16))).reshape(cols)
    f = np.zeros((nch, 4), np.float32)
    f[:, 0], f[:, 2] = d[:, 0], d[:, 1]
    rec = np.concatenate([hi.view(np.uint8), lo.view(np.uint8), f.view(np.uint8)], axis=1)
    assert rec.shape[1] == 80
    return rec.reshape(-1), xf


def main():
    shapes = [(4096, 14336), (14336, 4096), (4096, 4096)]
    only = sys.argv[1:]   # e.g. "mvi<16, 1, 1>" 4096x14336: those kernels and shapes alone (for Nsight)
    if only:
        shapes = [tuple(int(v) for v in a.split("x")) for a in only if "x" in a and "<" not in a] or shapes
    configs = [("mvi", 16, 1, 1, 0, 1), ("mvi", 8, 1, 2, 0, 1), ("mvs", 8, 1, 1), ("mvx", 16, 1), ("mvx", 8, 2), ("mvx", 8, 1), ("mvx", 16, 2)]
    src = SRC.replace("GRID_VALUES", ", ".join(f"{int(v)}u" for v in grid_words())).replace(
        "LUT_VALUES", ", ".join(f"{v}u" for v in lut_words())).replace(
        "TAB_VALUES", ", ".join(f"{int(v)}u" for v in tab_words()))
    names = [f"{c[0]}<{', '.join(str(v) for v in c[1:])}>" for c in configs]
    if any("<" in a for a in only):
        configs, names = zip(*[(c, n) for c, n in zip(configs, names) if n in only])
    mod = cp.RawModule(code=pdl.source_head() + pdl.C_PDL + src, options=("--std=c++17",), name_expressions=names)
    rng = np.random.default_rng(0)
    table = []
    for rows, cols in shapes:
        seed = int(rng.integers(1 << 30))
        rec, dense = make(rows, cols, np.random.default_rng(seed))
        srec, dense2 = make(rows, cols, np.random.default_rng(seed), signed_layout=True)
        hrec, dense3 = make(rows, cols, np.random.default_rng(seed), hybrid=True)
        assert np.array_equal(dense, dense2) and np.array_equal(dense, dense3)
        xrec, xf = x_records(cols, rng)
        ref = dense @ xf
        copies = [cp.asarray(rec) for _ in range(4)]
        scopies = [cp.asarray(srec) for _ in range(4)]
        hcopies = [cp.asarray(hrec) for _ in range(4)]
        xd, xrd = cp.asarray(xf.astype(np.float32)), cp.asarray(xrec)
        out = cp.zeros(rows, cp.float32)
        for (kind, w, *rest), name in zip(configs, names):
            nb = 1 if kind == "mvx" else rest[0]
            f = mod.get_function(name)
            smem = {"mvs": 32768, "mvx": 49152}.get(kind, 16384) + (w * nb * 16 * 4 if kind in ("mvi", "mvh", "mvs", "mvx") else 0) + (128 + cols * 4 if kind == "mvc" else 0)
            if kind == "mvit":
                smem += nb * (cols // 256) * 1632
                if smem > 227 * 1024 or -(-rows // (16 * nb)) > 132 or -(-(cols // 256) // w) > 16:
                    continue   # (one CTA an SM and one wave, or it does not fit)
            f.max_dynamic_shared_size_bytes = smem
            grid = (-(-rows // (16 * nb)),)
            xin = xd if kind == "mvc" else xrd
            wc = scopies if kind == "mvs" else hcopies if kind == "mvx" else copies
            launch = lambda i: pdl.call(f, grid, (32 * w,), (wc[i % 4], xin, out, np.int32(rows), np.int32(cols)), shared_mem=smem)
            out.fill(0)
            launch(0)
            cp.cuda.Device().synchronize()
            err = float(np.max(np.abs(out.get() - ref)) / np.max(np.abs(ref)))
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                s.begin_capture()
                for i in range(40):
                    launch(i)
                g = s.end_capture()
            ts = []
            for _ in range(7):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(s)
                g.launch(s)
                e1.record(s)
                e1.synchronize()
                ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1000 / 40)
            us = float(np.median(ts))
            regs = getattr(f, "num_regs", "?")
            table.append((f"{rows}x{cols}", name.replace(" ", ""), regs, err, us, rows * cols * 3.0625 / 8 / us / 1e3))
            print(table[-1], flush=True)
    print("\nshape        kernel      regs  max rel err     us   GB/s (IQ3_XXS bytes)")
    for sh, k, r, e, us, gbs in table:
        print(f"{sh:12s} {k:11s} {r!s:>4}  {e:.2e}  {us:6.2f}  {gbs:6.0f}")


if __name__ == "__main__":
    sys.exit(main())
