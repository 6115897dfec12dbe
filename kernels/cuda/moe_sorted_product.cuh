#include "moe_activation.cuh"
// The product over expert-sorted blocks of N token rows, R rows of the block's expert a CTA, a
// thread a 32-weight chunk (kernels/moe_products.py); after the type structs, load_x and block_sum.

template <class T, int N, int R>
__global__ void __launch_bounds__(128) moe_sorted_product(
        const unsigned char* __restrict__ w0, const unsigned char* __restrict__ w1, long long ebytes,
        const int* __restrict__ slot_of, const float* __restrict__ x, float* __restrict__ out0,
        float* __restrict__ out1, const int* __restrict__ blk_expert, const int* __restrict__ blk_rows,
        int kdiv, int S, int rows, int cols, int x_by_row) {
    const int b = blockIdx.y;
    const int e = blk_expert[b];
    if (e < 0) return;
    const int slot = slot_of ? slot_of[e] : e;
    if (slot < 0) return;                      // not resident this round
    T::init();                                 // per-type tables in shared memory (IQ grids); the
                                               // returns above are uniform over the block
    const unsigned char* w = (blockIdx.z ? w1 : w0) + (long long)slot * ebytes;
    float* out = blockIdx.z ? out1 : out0;
    int xr[N];                                 // the token of padded row b*N+n, -1 = padding
    #pragma unroll
    for (int n = 0; n < N; n++) {
        const int i = b * N + n;
        xr[n] = blk_rows ? blk_rows[i] : (i < S ? i / kdiv : -1);
    }
    // x_by_row: x is already in padded-row order (the down product reads the activations of gate
    // and up, one row per token-slot), so row i reads x row i, not its token's row. Padding rows
    // read row b*N (row 0 of a used block is always real) and are not written.
    const float* xp[N];
    #pragma unroll
    for (int n = 0; n < N; n++) {
        const int i = b * N + n;
        const int src = x_by_row ? (xr[n] >= 0 ? i : b * N) : (xr[n] >= 0 ? xr[n] : xr[0]);
        xp[n] = x + (long long)src * cols;
    }
    const int row0 = blockIdx.x * R, nb = cols / T::BE, chunks = nb * T::CPB;
    const long long rb = (long long)nb * T::TS;
    const unsigned char* rowp[R];
    #pragma unroll
    for (int r = 0; r < R; r++) rowp[r] = w + (long long)min(row0 + r, rows - 1) * rb;
    float acc[R][N];
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    for (int c = threadIdx.x; c < chunks; c += 128) {
        typename T::Raw cur[R];
        #pragma unroll
        for (int r = 0; r < R; r++) T::load(cur[r], rowp[r], c);
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float4 xv[8];
            float xa, xb;
            load_x<T>(xp[n], c, xv, xa, xb);
            #pragma unroll
            for (int r = 0; r < R; r++) acc[r][n] += T::dot(cur[r], c, xv, xa, xb);
        }
    }
    __shared__ float red[4][R * N];
    const float total = block_sum<R, N>(acc, red);
    if (threadIdx.x < R * N) {
        const int r = threadIdx.x / N, n = threadIdx.x % N;
        if (row0 + r < rows && xr[n] >= 0) out[(long long)(b * N + n) * rows + row0 + r] = total;
    }
}
