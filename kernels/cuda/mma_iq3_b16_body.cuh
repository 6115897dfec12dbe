// band_fused_end_write (the decode step's next op folded into the product), then bands16_product_body and the kernels.

// The end of bands16_product with the decode step's next op folded in:
// warp 0's lanes r < 16 hold row 16 band + r's product s. NM = 2 (scale in): s times scale[0] (x was xg =
// out * g of the norm before, kernels/matvec_epilogue.py); E = 1: out = s + res; E = 2 / 3 (silu / gelu_tanh):
// the band's rows are [gate u, up u] alternating (matvec_epilogue.interleave_rows), out (rows / 2) = act(gate)
// * up, fused_end_write's arithmetic. NM = 1 (norm out, with E = 1): also xg = out * g and part[band] = the band's sum
// of out^2 (a fixed order); the last CTA to count (counter, left at 0) sums the parts in a fixed order (warp 0,
// then a tree) and writes scale[0] = rsqrt(mean + eps). flag: a shared word (past the warps' sums):
// cupy_decode_src's last_block_to_count counts the same way with a static shared int, past 48 KB at A = 0. With xr, norm
// out also writes xg quantized as the next product's x (quantize_x_early<Iq3XxsBlock, 18>'s records, the same words: a band's 16
// outputs are one run of 16 of the next product's x), so that a scale-in product needs no quantizer launch.
struct BandEpilogueArgs { const float* res; const float* g; float* xg; float* part; float* scale; int* counter; float eps;
               unsigned* xr; };
// The 16 lanes' values v (lane r: value r of run `band` of x) as quantize_x_float4's records of layout 18 (its arithmetic).
__device__ __forceinline__ void band_quantize_run(float v, unsigned* __restrict__ o, int band) {
    const int r = threadIdx.x;                            // lanes 0-15 (16-31 carry 0 and write nothing)
    float a = fabsf(v);
    #pragma unroll
    for (int k = 1; k <= 8; k <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, k));
    const float inv = a > 0.f ? 127.f / a : 0.f, t = v * inv;
    const int qh = __float2int_rn(t), ql = __float2int_rn((t - (float)qh) * 254.f);
    unsigned hw = (unsigned)(qh & 0xFF) << (8 * (r & 3)), lw = (unsigned)(ql & 0xFF) << (8 * (r & 3));
    #pragma unroll
    for (int k = 1; k <= 2; k <<= 1) { hw |= __shfl_xor_sync(0xffffffffu, hw, k); lw |= __shfl_xor_sync(0xffffffffu, lw, k); }
    const int c = band >> 1, run = band & 1;
    if (r < 16 && (r & 3) == 0) {
        o[x_record_word<18>(c, 4 * run + (r >> 2))] = hw;
        o[x_record_word<18>(c, 8 + 4 * run + (r >> 2))] = lw;
    }
    if (r == 0) o[x_record_word<18>(c, 16 + run)] = __float_as_uint(a * (1.f / (127.f * 254.f)));
}
template <int EPILOGUE, int NORM_MODE>
__device__ __forceinline__ void band_fused_end_write(float s, float* __restrict__ out, int rows, BandEpilogueArgs ep, int band,
                                           int* flag) {
    const float* __restrict__ res = ep.res;
    const float* __restrict__ scale = ep.scale;
    if constexpr (NORM_MODE == 1) {
        static_assert(EPILOGUE == 1, "norm out goes with the residual add");
        float y = 0.f;
        if (threadIdx.x < 16) {
            y = s + res[band * 16 + threadIdx.x];
            out[band * 16 + threadIdx.x] = y;
            ep.xg[band * 16 + threadIdx.x] = y * ep.g[band * 16 + threadIdx.x];
        }
        if (threadIdx.x < 32) {
            float sq = y * y;                             // lanes 16-31: 0
            #pragma unroll
            for (int o = 8; o >= 1; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
            if (threadIdx.x == 0) ep.part[band] = sq;
            if (ep.xr) band_quantize_run(threadIdx.x < 16 ? y * ep.g[band * 16 + threadIdx.x] : 0.f, ep.xr, band);
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            const int ticket = atomicAdd(ep.counter, 1);
            *flag = ticket == (int)gridDim.x - 1;
            if (*flag) *ep.counter = 0;                   // every CTA has counted: ready for the next launch
        }
        __syncthreads();
        if (*flag && threadIdx.x < 32) {
            __threadfence();
            float v = 0.f;
            for (int p = threadIdx.x; p < (int)gridDim.x; p += 32) v += __ldcg(ep.part + p);
            #pragma unroll
            for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (threadIdx.x == 0) ep.scale[0] = rsqrtf(v / rows + ep.eps);
        }
    } else if constexpr (EPILOGUE <= 1) {
        if (threadIdx.x < 16) {
            if constexpr (NORM_MODE == 2) s *= __ldg(scale);
            if constexpr (EPILOGUE == 1) s += res[band * 16 + threadIdx.x];
            out[band * 16 + threadIdx.x] = s;
        }
    } else {
        if (threadIdx.x >= 32) return;
        if constexpr (NORM_MODE == 2) s *= __ldg(scale);
        const float u = __shfl_xor_sync(0xffffffffu, s, 1);    // lane 2 i: gate i, its up from lane 2 i + 1
        if (threadIdx.x < 16 && (threadIdx.x & 1) == 0) {
            const float g = s;
            float y;
            if constexpr (EPILOGUE == 2) y = g / (1.0f + expf(-g)) * u;
            else y = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
            out[band * 8 + (threadIdx.x >> 1)] = y;
        }
    }
}


template <int WARPS, int PREFETCH, int ALIGNED_TABLE, int SIGNS_ADD, int EPILOGUE, int NORM_MODE, int PREDECODE>
__device__ __forceinline__ void bands16_product_body(const unsigned char* __restrict__ w, const float* __restrict__ xq,
                                         float* __restrict__ out, int rows, int cols, BandEpilogueArgs ep) {
    unsigned tb;
    uint4* const tab = band_signed_table_ptr<ALIGNED_TABLE>(tb);
    uint4* const grid32 = band_grid_copies;
    const int nblk = cols >> 8, band = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
    const int half = lane >> 4, qh = q >> 1;             // half: B's columns 4-7 (chunk c + 1); qh: this lane's chunk
    const unsigned char* base = w + (long long)band * nblk * 1632;
#ifdef BANDS16_STAMPS
    const unsigned stamp_n = threadIdx.x == 0 ? atomicAdd(&band_stamp_launches[blockIdx.x], 1u) : 0u;   // the launch
#endif
    BANDS16_STAMP(0);
    const BandWeightStream ls;
    BandRecord ring[PREFETCH + 1];
    #pragma unroll
    for (int k = 0; k < PREFETCH; k++)
        if (warp + k * WARPS < nblk) band_load_record(ring[k], base + (long long)(warp + k * WARPS) * 1632, lane, ls);
    {   // the loads first (a load-store loop waits a load a store)
        uint4 t[(1024 + 32 * WARPS - 1) / (32 * WARPS)];
        constexpr int GK = (256 + 32 * WARPS - 1) / (32 * WARPS);   // grid entries a thread
        unsigned g[GK];
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * WARPS - 1) / (32 * WARPS); k++)
            if (threadIdx.x + k * 32 * WARPS < 1024) t[k] = __ldg((const uint4*)LT_TAB4096 + threadIdx.x + k * 32 * WARPS);
        #pragma unroll
        for (int k = 0; k < GK; k++) g[k] = threadIdx.x + k * 32 * WARPS < 256 ? __ldg(IQ3XXS_GRID + threadIdx.x + k * 32 * WARPS) : 0u;
        #pragma unroll
        for (int k = 0; k < (1024 + 32 * WARPS - 1) / (32 * WARPS); k++)
            if (threadIdx.x + k * 32 * WARPS < 1024) tab[threadIdx.x + k * 32 * WARPS] = t[k];
        #pragma unroll
        for (int k = 0; k < GK; k++) {                    // 8 stores of 16 bytes an entry, lane l from store l % 8
            const unsigned e = threadIdx.x + k * 32 * WARPS;
            if (e < 256)
                #pragma unroll
                for (int j = 0; j < 8; j++) grid32[e * 8 + ((j + threadIdx.x) & 7)] = make_uint4(g[k], g[k], g[k], g[k]);
        }
    }
    __syncthreads();
    // D = 1: the warp's first block decoded (band_decode_a: its A fragments need no x) before the
    // PDL wait, while the quantizer before this kernel runs; the ring moved up a slot behind it.
    BandAFragments first;
    if (PREDECODE) {
        if (warp < nblk) band_decode_a<ALIGNED_TABLE, SIGNS_ADD>(ring[0], lane, tb, first);
        #pragma unroll
        for (int k = 0; k + 1 < PREFETCH; k++) ring[k] = ring[k + 1];
        if (warp + PREFETCH * WARPS < nblk) band_load_record(ring[PREFETCH - 1], base + (long long)(warp + PREFETCH * WARPS) * 1632, lane, ls);
    }
    BANDS16_STAMP(1);
    PDL_PROLOGUE();
    BANDS16_STAMP(2);
    const unsigned* xw = (const unsigned*)xq;
    const unsigned m0 = (gq & 2) ? 0u : ~0u, m1 = ~m0, ma = half ? 0u : ~0u;   // B's column gq % 4: hi_a, lo_a, hi_b, lo_b
    float acc0 = 0.f, acc1 = 0.f;                         // rows g, g + 8
    // The ring turns by unrolling P + 1 blocks (slot u's block computed, slot (u + P) % (P + 1) loaded):
    // with copies between slots each copy waited for the load just issued.
    if (PREDECODE && warp < nblk) {
        BandXFragments x;
        x.load(xw + 144 * (warp), lane);
        band_multiply_x<SIGNS_ADD>(first, x, qh, m0, m1, ma, acc0, acc1);
    }
    for (int j0 = warp + PREDECODE * WARPS; j0 < nblk; j0 += (PREFETCH + 1) * WARPS) {
        #pragma unroll
        for (int u = 0; u <= PREFETCH; u++) {
            const int j = j0 + u * WARPS;
            if (j >= nblk) break;
            if (j + PREFETCH * WARPS < nblk) band_load_record(ring[(u + PREFETCH) % (PREFETCH + 1)], base + (long long)(j + PREFETCH * WARPS) * 1632, lane, ls);
            BandXFragments x;
            x.load(xw + 144 * (j), lane);
            band_block_product<ALIGNED_TABLE, SIGNS_ADD>(ring[u], x, lane, qh, tb, m0, m1, ma, acc0, acc1);
        }
    }
    BANDS16_STAMP(3);
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
        for (int k = 0; k < WARPS; k++) s += red[k * 16 + threadIdx.x];
        s = 0.25f * s;                                    // (2 sc + 1) / 4 = (0.5 + sc) / 2
    }
    band_fused_end_write<EPILOGUE, NORM_MODE>(s, out, rows, ep, band, (int*)tab + 16 * WARPS);
    BANDS16_STAMP(4);
}
template <int WARPS, int PREFETCH, int ALIGNED_TABLE, int SIGNS_ADD = 0, int PREDECODE = 0>
__global__ void __launch_bounds__(32 * WARPS, 2) bands16_product(const unsigned char* __restrict__ w, const float* __restrict__ xq,
                                                 float* __restrict__ out, int rows, int cols) {
    bands16_product_body<WARPS, PREFETCH, ALIGNED_TABLE, SIGNS_ADD, 0, 0, PREDECODE>(w, xq, out, rows, cols, BandEpilogueArgs{});
}
// bands16_product_fused_end: bands16_product with the epilogue E and the norm's NM of band_fused_end_write; the arguments after cols as matvec_fused_end's.
template <int WARPS, int PREFETCH, int ALIGNED_TABLE, int SIGNS_ADD, int EPILOGUE, int NORM_MODE, int PREDECODE = 0>
__global__ void __launch_bounds__(32 * WARPS, 2) bands16_product_fused_end(const unsigned char* __restrict__ w, const float* __restrict__ xq,
                                                  float* __restrict__ out, int rows, int cols, const float* res,
                                                  const float* g, float* xg, float* part, float* scale, int* counter,
                                                  float eps, unsigned* xr) {
    bands16_product_body<WARPS, PREFETCH, ALIGNED_TABLE, SIGNS_ADD, EPILOGUE, NORM_MODE, PREDECODE>(w, xq, out, rows, cols, BandEpilogueArgs{res, g, xg, part, scale, counter, eps, xr});
}
