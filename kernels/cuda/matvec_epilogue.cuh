
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
template <int N>
__device__ __forceinline__ void norm_scale(const float* part, int nparts, int cols, float eps,
                                           float* __restrict__ scale) {
    __shared__ float sred[4][N];
    #pragma unroll
    for (int n = 0; n < N; n++) {
        float v = 0.f;
        for (int p = threadIdx.x; p < nparts; p += 128) v += __ldcg(part + (long long)n * nparts + p);
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if ((threadIdx.x & 31) == 0) sred[threadIdx.x >> 5][n] = v;
    }
    __syncthreads();
    if (threadIdx.x < N) {
        const int n = threadIdx.x;
        scale[threadIdx.x] = rsqrtf(((sred[0][n] + sred[1][n]) + (sred[2][n] + sred[3][n])) / cols + eps);
    }
}
// The end of matvec_fused_end: total (thread r*N+n: row r, x n) through epilogue E into out.
template <int N, int R, int E, int NM, bool IL>
__device__ __forceinline__ void mve_end(float total, float* __restrict__ out, int rows, int F, int H,
                                        int u0, const float* __restrict__ res, const float* __restrict__ g,
                                        float* xg, float* __restrict__ part,
                                        float* __restrict__ scale, int* counter, float eps) {
    if constexpr (NM == 1) {      // E == 1, R * N <= 32: warp 0 holds every total
        if (threadIdx.x < 32) {
            const int r = threadIdx.x / N, n = threadIdx.x % N;
            const long long i = (long long)n * rows + u0 + r;
            float y = 0.f;
            if (threadIdx.x < R * N && u0 + r < rows) {
                y = total + res[i];
                out[i] = y;
                xg[i] = y * g[u0 + r];
            }
            float sq = y * y;     // lanes r*N+n, r = 0..R-1: xor over multiples of N keeps n
            #pragma unroll
            for (int o = N; o < R * N; o <<= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
            if (threadIdx.x < N) part[(long long)n * gridDim.x + blockIdx.x] = sq;
        }
        if (last_block_to_count(counter, gridDim.x)) norm_scale<N>(part, gridDim.x, rows, eps, scale);
    } else if constexpr (E <= 1) {
        if (threadIdx.x < R * N) {
            const int r = threadIdx.x / N, n = threadIdx.x % N;
            const long long i = (long long)n * rows + u0 + r;
            if constexpr (E == 1) { if (u0 + r < rows) out[i] = total + res[i]; }
            else { if (u0 + r < rows) out[i] = total; }
        }
    } else {
        __shared__ float tot[R * N];
        if (threadIdx.x < R * N) tot[threadIdx.x] = total;
        __syncthreads();
        if (threadIdx.x < H * N) {
            const int r = threadIdx.x / N, n = threadIdx.x % N;
            const int rg = IL ? 2 * r : r, ru = IL ? 2 * r + 1 : r + H;
            const float g = tot[rg * N + n], u = tot[ru * N + n];
            float y;
            if constexpr (E == 2) y = g / (1.0f + expf(-g)) * u;
            else y = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
            if (u0 + r < F) out[(long long)n * F + u0 + r] = y;
        }
    }
}
template <class T, int N, int R, int P, int E, int NM, bool IL = false>
__global__ void __launch_bounds__(128) matvec_fused_end(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                           float* __restrict__ out, int rows, int cols,
                                           const float* __restrict__ res, const float* __restrict__ g,
                                           float* xg, float* part, float* scale,
                                           int* counter, float eps) {
    constexpr int H = E >= 2 ? R / 2 : R;                 // output units a CTA
    const int F = E >= 2 ? rows / 2 : rows;               // output width
    const int u0 = blockIdx.x * H, nb = cols / T::BE, chunks = nb * T::CPB;
    const long long rb = (long long)nb * T::TS;
    T::init();                    // per-type tables in shared memory (IQ3_XXS's grid; K types: none)
    const unsigned char* rowp[R];
    #pragma unroll
    for (int r = 0; r < R; r++)   // units past the end re-read the last one and are not written
        rowp[r] = w + (IL ? (long long)min(2 * u0 + r, rows - 1)
                          : (long long)min(u0 + r % H, F - 1) + (r >= H ? F : 0)) * rb;
    PDL_PROLOGUE();               // (kernels/pdl.py)
    float acc[R][N];
    mv_rows_any<T, N, R, P>(rowp, x, cols, chunks, acc);
    __shared__ float red[4][R * N];
    float total = block_sum<R, N>(acc, red);
    if constexpr (NM == 2) total *= __ldg(scale + threadIdx.x % N);
    mve_end<N, R, E, NM, IL>(total, out, rows, F, H, u0, res, g, xg, part, scale, counter, eps);
}
