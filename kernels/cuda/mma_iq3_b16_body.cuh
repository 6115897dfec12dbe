
template <int W, int P, int A, int SG, int E, int NM, int D>
__device__ __forceinline__ void bands16_product_body(const unsigned char* __restrict__ w, const float* __restrict__ xq,
                                         float* __restrict__ out, int rows, int cols, LtEpi ep) {
    unsigned tb;
    uint4* const tab = lt_b16_table<A>(tb);
    uint4* const grid32 = lt_b16_grid32;
    const int nblk = cols >> 8, band = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
    const int half = lane >> 4, qh = q >> 1;             // half: B's columns 4-7 (chunk c + 1); qh: this lane's chunk
    const unsigned char* base = w + (long long)band * nblk * 1632;
#ifdef LT_MVB_STAMPS
    const unsigned stamp_n = threadIdx.x == 0 ? atomicAdd(&lt_mvb_count[blockIdx.x], 1u) : 0u;   // the launch
#endif
    LT_STAMP(0);
    const LtStream ls;
    LtB16 ring[P + 1];
    #pragma unroll
    for (int k = 0; k < P; k++)
        if (warp + k * W < nblk) lt_b16_load(ring[k], base + (long long)(warp + k * W) * 1632, lane, ls);
    {   // the loads first (a load-store loop waits a load a store)
        uint4 t[(1024 + 32 * W - 1) / (32 * W)];
        constexpr int GK = (256 + 32 * W - 1) / (32 * W);   // grid entries a thread
        unsigned g[GK];
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * W - 1) / (32 * W); k++)
            if (threadIdx.x + k * 32 * W < 1024) t[k] = __ldg((const uint4*)LT_TAB4096 + threadIdx.x + k * 32 * W);
        #pragma unroll
        for (int k = 0; k < GK; k++) g[k] = threadIdx.x + k * 32 * W < 256 ? __ldg(IQ3XXS_GRID + threadIdx.x + k * 32 * W) : 0u;
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * W - 1) / (32 * W); k++)
            if (threadIdx.x + k * 32 * W < 1024) tab[threadIdx.x + k * 32 * W] = t[k];
        #pragma unroll
        for (int k = 0; k < GK; k++) {                    // 8 stores of 16 bytes an entry, lane l from store l % 8
            const unsigned e = threadIdx.x + k * 32 * W;
            if (e < 256)
                #pragma unroll
                for (int j = 0; j < 8; j++) grid32[e * 8 + ((j + threadIdx.x) & 7)] = make_uint4(g[k], g[k], g[k], g[k]);
        }
    }
    __syncthreads();
    // D = 1: the warp's first block decoded (lt_b16_decode: its A fragments need no x) before the
    // PDL wait, while the quantizer before this kernel runs; the ring moved up a slot behind it.
    LtA first;
    if (D) {
        if (warp < nblk) lt_b16_decode<A, SG>(ring[0], lane, tb, first);
        #pragma unroll
        for (int k = 0; k + 1 < P; k++) ring[k] = ring[k + 1];
        if (warp + P * W < nblk) lt_b16_load(ring[P - 1], base + (long long)(warp + P * W) * 1632, lane, ls);
    }
    LT_STAMP(1);
    PDL_PROLOGUE();
    LT_STAMP(2);
    const unsigned* xw = (const unsigned*)xq;
    const unsigned m0 = (gq & 2) ? 0u : ~0u, m1 = ~m0, ma = half ? 0u : ~0u;   // B's column gq % 4: hi_a, lo_a, hi_b, lo_b
    float acc0 = 0.f, acc1 = 0.f;                         // rows g, g + 8
    // The ring turns by unrolling P + 1 blocks (slot u's block computed, slot (u + P) % (P + 1) loaded):
    // with copies between slots each copy waited for the load just issued.
    if (D && warp < nblk) {
        LtX x;
        x.load(xw + 144 * (warp), lane);
        lt_b16_mul<SG>(first, x, qh, m0, m1, ma, acc0, acc1);
    }
    for (int j0 = warp + D * W; j0 < nblk; j0 += (P + 1) * W) {
        #pragma unroll
        for (int u = 0; u <= P; u++) {
            const int j = j0 + u * W;
            if (j >= nblk) break;
            if (j + P * W < nblk) lt_b16_load(ring[(u + P) % (P + 1)], base + (long long)(j + P * W) * 1632, lane, ls);
            LtX x;
            x.load(xw + 144 * (j), lane);
            lt_b16_block<A, SG>(ring[u], x, lane, qh, tb, m0, m1, ma, acc0, acc1);
        }
    }
    LT_STAMP(3);
    #pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {                    // the quad's (chunk, run) parts
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, o);
        acc1 += __shfl_xor_sync(0xffffffffu, acc1, o);
    }
    __syncthreads();                                      // every lookup done: tab holds the sums now
    float* red = (float*)tab;                             // [W][16]
    if (q == 0) { red[warp * 16 + gq] = acc0; red[warp * 16 + gq + 8] = acc1; }
    __syncthreads();
    float s = 0.f;
    if (threadIdx.x < 16) {
        for (int k = 0; k < W; k++) s += red[k * 16 + threadIdx.x];
        s = 0.25f * s;                                    // (2 sc + 1) / 4 = (0.5 + sc) / 2
    }
    lt_mvb_end<E, NM>(s, out, rows, ep, band, (int*)tab + 16 * W);
    LT_STAMP(4);
}
template <int W, int P, int A, int SG = 0, int D = 0>
__global__ void __launch_bounds__(32 * W, 2) bands16_product(const unsigned char* __restrict__ w, const float* __restrict__ xq,
                                                 float* __restrict__ out, int rows, int cols) {
    bands16_product_body<W, P, A, SG, 0, 0, D>(w, xq, out, rows, cols, LtEpi{});
}
// bands16_product_fused_end: bands16_product with the epilogue E and the norm's NM of lt_mvb_end; the arguments after cols as matvec_fused_end's.
template <int W, int P, int A, int SG, int E, int NM, int D = 0>
__global__ void __launch_bounds__(32 * W, 2) bands16_product_fused_end(const unsigned char* __restrict__ w, const float* __restrict__ xq,
                                                  float* __restrict__ out, int rows, int cols, const float* res,
                                                  const float* g, float* xg, float* part, float* scale, int* counter,
                                                  float eps, unsigned* xr) {
    bands16_product_body<W, P, A, SG, E, NM, D>(w, xq, out, rows, cols, LtEpi{res, g, xg, part, scale, counter, eps, xr});
}
