
template <int N>
__global__ void __launch_bounds__(128) matvec_iq4_xs(const unsigned* __restrict__ w32,
        const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    __shared__ float kv[16];
    if (threadIdx.x < 16) kv[threadIdx.x] = (float)IQ4_KVALUES[threadIdx.x];
    __syncthreads();
    const int row0 = blockIdx.x * IQ_ROWS, nsub = cols >> 5;
    const long long row_words = (long long)(cols >> 8) * 34;
    float acc[IQ_ROWS][N];
    #pragma unroll
    for (int r = 0; r < IQ_ROWS; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    for (int s = threadIdx.x; s < nsub; s += 128) {
        const int blk = s >> 3, ib = s & 7;
        uint4 q[IQ_ROWS];
        float dl[IQ_ROWS];
        #pragma unroll
        for (int r = 0; r < IQ_ROWS; r++) {
            const unsigned* b = w32 + min(row0 + r, rows - 1) * row_words + blk * 34;
            const uint2 lo = __ldg((const uint2*)(b + 2 + 4 * ib)), hi = __ldg((const uint2*)(b + 4 + 4 * ib));
            q[r] = make_uint4(lo.x, lo.y, hi.x, hi.y);
            const unsigned w0 = __ldg(b), w1 = __ldg(b + 1);
            const int ls = (int)(((w1 >> (8 * (ib >> 1) + 4 * (ib & 1))) & 15u) | (((w0 >> (16 + 2 * ib)) & 3u) << 4));
            dl[r] = h2f((unsigned short)(w0 & 0xffffu)) * (float)(ls - 32);
        }
        #pragma unroll
        for (int n = 0; n < N; n++) {
            const float4* xp = (const float4*)(x + (long long)n * cols) + s * 8;
            float4 xv[8];
            #pragma unroll
            for (int k = 0; k < 8; k++) xv[k] = __ldg(xp + k);
            #pragma unroll
            for (int r = 0; r < IQ_ROWS; r++) {
                const unsigned qw[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
                acc[r][n] = fmaf(dl[r], iq4_dot32(qw, xv, kv), acc[r][n]);
            }
        }
    }
    finish<N>(acc, out, rows, row0);
}
