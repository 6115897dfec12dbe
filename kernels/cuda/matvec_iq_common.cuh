
#define IQ_ROWS 4
// 32 IQ4_XS weights times x: the 4 words of a sub-block (low nibbles its values 0..15 in byte order,
// high nibbles 16..31) through the 16-entry value table kv (shared memory), x as 8 float4.
__device__ __forceinline__ float iq4_dot32(const unsigned (&qw)[4], const float4* xv, const float* kv) {
    float sum = 0.f;
    #pragma unroll
    for (int k = 0; k < 4; k++) {   // bytes 4k..4k+3: low nibbles values 4k.., high 16+4k..
        const unsigned w = qw[k];
        const float4 a = xv[k], c = xv[k + 4];
        sum = fmaf(kv[w & 15u], a.x, sum);         sum = fmaf(kv[(w >> 8) & 15u], a.y, sum);
        sum = fmaf(kv[(w >> 16) & 15u], a.z, sum); sum = fmaf(kv[(w >> 24) & 15u], a.w, sum);
        sum = fmaf(kv[(w >> 4) & 15u], c.x, sum);  sum = fmaf(kv[(w >> 12) & 15u], c.y, sum);
        sum = fmaf(kv[(w >> 20) & 15u], c.z, sum); sum = fmaf(kv[w >> 28], c.w, sum);
    }
    return sum;
}
// Sums acc over the warp, then over the 4 warps of the block; thread r*N+n ends with row r, x n.
template <int N>
__device__ __forceinline__ void finish(float (&acc)[IQ_ROWS][N], float* __restrict__ out, int rows, int row0) {
    __shared__ float red[4][IQ_ROWS * N];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    #pragma unroll
    for (int r = 0; r < IQ_ROWS; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float v = acc[r][n];
            #pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == 0) red[warp][r * N + n] = v;
        }
    __syncthreads();
    if (threadIdx.x < IQ_ROWS * N) {
        const int r = threadIdx.x / N, n = threadIdx.x % N;
        if (row0 + r < rows)
            out[(long long)n * rows + row0 + r] = red[0][threadIdx.x] + red[1][threadIdx.x]
                                                  + red[2][threadIdx.x] + red[3][threadIdx.x];
    }
}
#define XS(v, m) __int_as_float(__float_as_int(v) ^ (m))
