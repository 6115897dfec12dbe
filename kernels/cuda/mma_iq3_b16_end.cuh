
// The end of bands16_product with the decode step's next op folded in:
// warp 0's lanes r < 16 hold row 16 band + r's product s. NM = 2 (scale in): s times scale[0] (x was xg =
// out * g of the norm before, kernels/matvec_epilogue.py); E = 1: out = s + res; E = 2 / 3 (silu / gelu_tanh):
// the band's rows are [gate u, up u] alternating (matvec_epilogue.interleave_rows), out (rows / 2) = act(gate)
// * up, mve_end's arithmetic. NM = 1 (norm out, with E = 1): also xg = out * g and part[band] = the band's sum
// of out^2 (a fixed order); the last CTA to count (counter, left at 0) sums the parts in a fixed order (warp 0,
// then a tree) and writes scale[0] = rsqrt(mean + eps). flag: a shared word (past the warps' sums):
// cupy_decode_src's last_block_to_count counts the same way with a static shared int, past 48 KB at A = 0. With xr, norm
// out also writes xg quantized as the next product's x (quantize_x_early<TIQ3_XXS, 18>'s records, the same words: a band's 16
// outputs are one run of 16 of the next product's x), so that a scale-in product needs no quantizer launch.
struct LtEpi { const float* res; const float* g; float* xg; float* part; float* scale; int* counter; float eps;
               unsigned* xr; };
// The 16 lanes' values v (lane r: value r of run `band` of x) as quantize_x_float4's records of layout 18 (its arithmetic).
__device__ __forceinline__ void lt_mvb_quantize_run(float v, unsigned* __restrict__ o, int band) {
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
        o[lt_q8w<18>(c, 4 * run + (r >> 2))] = hw;
        o[lt_q8w<18>(c, 8 + 4 * run + (r >> 2))] = lw;
    }
    if (r == 0) o[lt_q8w<18>(c, 16 + run)] = __float_as_uint(a * (1.f / (127.f * 254.f)));
}
template <int E, int NM>
__device__ __forceinline__ void lt_mvb_end(float s, float* __restrict__ out, int rows, LtEpi ep, int band,
                                           int* flag) {
    const float* __restrict__ res = ep.res;
    const float* __restrict__ scale = ep.scale;
    if constexpr (NM == 1) {
        static_assert(E == 1, "norm out goes with the residual add");
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
            if (ep.xr) lt_mvb_quantize_run(threadIdx.x < 16 ? y * ep.g[band * 16 + threadIdx.x] : 0.f, ep.xr, band);
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
    } else if constexpr (E <= 1) {
        if (threadIdx.x < 16) {
            if constexpr (NM == 2) s *= __ldg(scale);
            if constexpr (E == 1) s += res[band * 16 + threadIdx.x];
            out[band * 16 + threadIdx.x] = s;
        }
    } else {
        if (threadIdx.x >= 32) return;
        if constexpr (NM == 2) s *= __ldg(scale);
        const float u = __shfl_xor_sync(0xffffffffu, s, 1);    // lane 2 i: gate i, its up from lane 2 i + 1
        if (threadIdx.x < 16 && (threadIdx.x & 1) == 0) {
            const float g = s;
            float y;
            if constexpr (E == 2) y = g / (1.0f + expf(-g)) * u;
            else y = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
            out[band * 8 + (threadIdx.x >> 1)] = y;
        }
    }
}
