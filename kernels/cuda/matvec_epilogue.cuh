
// matvec_rows with the next decode op folded into its end (one launch fewer a use, see EPILOGUES):
// E = 1: out = x @ W.T + res (the residual add after the attention-output and down products).
// E = 2 / 3: W is [gate; up] (rows = 2F); a CTA takes R/2 units, i.e. gate rows u0.. and up rows
// F+u0.., and writes act(g) * u, silu (2) or gelu_tanh (3), as (n, F): the FFN's activation.
// IL (gated only): W's rows are [gate; up] interleaved (gate u, up u, gate u+1, ...: a CTA's 2H
// rows are contiguous) instead of F gate rows then F up rows.
// E = 0 (only with NM = 2): out = the product.
// NM, the RMSNorm split across two launches (lite/backends/cuda_norm.py):
//   1 (norm out, E = 1): also xg = out * g and part[n * gridDim.x + blockIdx.x] = this CTA's sum of
//     out^2; the last CTA to finish (counter) sums them in a fixed order (the same in every run)
//     and writes scale[n] = rsqrt(mean + eps);
//   2 (scale in): x is such an xg; each total is multiplied by scale[n] before the epilogue, so
//     that the product is of rms_norm(out) * g.
// The arithmetic of the add and the activations is cupy_ops' (`a + b`, silu_mul, gelu_tanh_mul).
// NM = 1, the last CTA: scale[n] = rsqrt(mean + eps) of out n from the CTAs' sums of squares.
template <int TOKENS>
__device__ __forceinline__ void norm_scale(const float* part, int nparts, int cols, float eps,
                                           float* __restrict__ scale) {
    __shared__ float sred[4][TOKENS];
    #pragma unroll
    for (int n = 0; n < TOKENS; n++) {
        float v = 0.f;
        for (int p = threadIdx.x; p < nparts; p += 128) v += __ldcg(part + (long long)n * nparts + p);
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if ((threadIdx.x & 31) == 0) sred[threadIdx.x >> 5][n] = v;
    }
    __syncthreads();
    if (threadIdx.x < TOKENS) {
        const int n = threadIdx.x;
        scale[threadIdx.x] = rsqrtf(((sred[0][n] + sred[1][n]) + (sred[2][n] + sred[3][n])) / cols + eps);
    }
}
// The end of matvec_fused_end: total (thread r*N+n: row r, x n) through epilogue E into out.
template <int TOKENS, int ROWS_PER_CTA, int EPILOGUE, int NORM_MODE, bool INTERLEAVED>
__device__ __forceinline__ void fused_end_write(float total, float* __restrict__ out, int rows, int F, int H,
                                        int u0, const float* __restrict__ res, const float* __restrict__ g,
                                        float* xg, float* __restrict__ part,
                                        float* __restrict__ scale, int* counter, float eps) {
    if constexpr (NORM_MODE == 1) {      // E == 1, R * N <= 32: warp 0 holds every total
        if (threadIdx.x < 32) {
            const int r = threadIdx.x / TOKENS, n = threadIdx.x % TOKENS;
            const long long i = (long long)n * rows + u0 + r;
            float y = 0.f;
            if (threadIdx.x < ROWS_PER_CTA * TOKENS && u0 + r < rows) {
                y = total + res[i];
                out[i] = y;
                xg[i] = y * g[u0 + r];
            }
            float sq = y * y;     // lanes r*N+n, r = 0..R-1: xor over multiples of N keeps n
            #pragma unroll
            for (int o = TOKENS; o < ROWS_PER_CTA * TOKENS; o <<= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
            if (threadIdx.x < TOKENS) part[(long long)n * gridDim.x + blockIdx.x] = sq;
        }
        if (last_block_to_count(counter, gridDim.x)) norm_scale<TOKENS>(part, gridDim.x, rows, eps, scale);
    } else if constexpr (EPILOGUE <= 1) {
        if (threadIdx.x < ROWS_PER_CTA * TOKENS) {
            const int r = threadIdx.x / TOKENS, n = threadIdx.x % TOKENS;
            const long long i = (long long)n * rows + u0 + r;
            if constexpr (EPILOGUE == 1) { if (u0 + r < rows) out[i] = total + res[i]; }
            else { if (u0 + r < rows) out[i] = total; }
        }
    } else {
        __shared__ float tot[ROWS_PER_CTA * TOKENS];
        if (threadIdx.x < ROWS_PER_CTA * TOKENS) tot[threadIdx.x] = total;
        __syncthreads();
        if (threadIdx.x < H * TOKENS) {
            const int r = threadIdx.x / TOKENS, n = threadIdx.x % TOKENS;
            const int rg = INTERLEAVED ? 2 * r : r, ru = INTERLEAVED ? 2 * r + 1 : r + H;
            const float g = tot[rg * TOKENS + n], u = tot[ru * TOKENS + n];
            float y;
            if constexpr (EPILOGUE == 2) y = g / (1.0f + expf(-g)) * u;
            else y = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
            if (u0 + r < F) out[(long long)n * F + u0 + r] = y;
        }
    }
}
template <class TYPE_STRUCT, int TOKENS, int ROWS_PER_CTA, int PREFETCH, int EPILOGUE, int NORM_MODE, bool INTERLEAVED = false>
__global__ void __launch_bounds__(128) matvec_fused_end(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                           float* __restrict__ out, int rows, int cols,
                                           const float* __restrict__ res, const float* __restrict__ g,
                                           float* xg, float* part, float* scale,
                                           int* counter, float eps) {
    constexpr int H = EPILOGUE >= 2 ? ROWS_PER_CTA / 2 : ROWS_PER_CTA;                 // output units a CTA
    const int F = EPILOGUE >= 2 ? rows / 2 : rows;               // output width
    const int u0 = blockIdx.x * H, nb = cols / TYPE_STRUCT::BE, chunks = nb * TYPE_STRUCT::CPB;
    const long long rb = (long long)nb * TYPE_STRUCT::TS;
    TYPE_STRUCT::init();                    // per-type tables in shared memory (IQ3_XXS's grid; K types: none)
    const unsigned char* rowp[ROWS_PER_CTA];
    #pragma unroll
    for (int r = 0; r < ROWS_PER_CTA; r++)   // units past the end re-read the last one and are not written
        rowp[r] = w + (INTERLEAVED ? (long long)min(2 * u0 + r, rows - 1)
                          : (long long)min(u0 + r % H, F - 1) + (r >= H ? F : 0)) * rb;
    PDL_PROLOGUE();               // (kernels/pdl.py)
    float acc[ROWS_PER_CTA][TOKENS];
    matvec_rows_partials<TYPE_STRUCT, TOKENS, ROWS_PER_CTA, PREFETCH>(rowp, x, cols, chunks, acc);
    __shared__ float red[4][ROWS_PER_CTA * TOKENS];
    float total = block_sum<ROWS_PER_CTA, TOKENS>(acc, red);
    if constexpr (NORM_MODE == 2) total *= __ldg(scale + threadIdx.x % TOKENS);
    fused_end_write<TOKENS, ROWS_PER_CTA, EPILOGUE, NORM_MODE, INTERLEAVED>(total, out, rows, F, H, u0, res, g, xg, part, scale, counter, eps);
}
