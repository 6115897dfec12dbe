// One tile of the dequantize kernel; kernels/dequant_common.py c_source fills in its placeholders per type and output.
extern "C" __global__ void __launch_bounds__(THREADS) deq_NAME_OUT(
        const uchar* __restrict__ src, long long nbytes, OUT_T* __restrict__ out, long long n) {
    __shared__ __align__(16) uchar sm[TILE_BYTES];
    const long long byte0 = (long long)blockIdx.x * TILE_BYTES;
    const long long left = nbytes - byte0;
    const int have = left < TILE_BYTES ? (int)left : TILE_BYTES;
    const uchar* g = src + byte0;
    if ((((size_t)g) & 15) == 0) {
        // Reading up to 15 bytes past the end stays inside the last aligned 16-byte chunk.
        const int nv = (have + 15) >> 4;
        uint4 r[VEC_PER_THREAD];
        #pragma unroll
        for (int k = 0; k < VEC_PER_THREAD; k++) {
            int i = threadIdx.x + k * THREADS;
            if (i < nv) r[k] = __ldg((const uint4*)g + i);
        }
        #pragma unroll
        for (int k = 0; k < VEC_PER_THREAD; k++) {
            int i = threadIdx.x + k * THREADS;
            if (i < nv) ((uint4*)sm)[i] = r[k];
        }
    } else {
        for (int i = threadIdx.x; i < have; i += THREADS) sm[i] = g[i];
    }
    __syncthreads();
    const bool vec_ok = (((size_t)out) & 15) == 0;
    #pragma unroll
    for (int grp = 0; grp < GROUPS; grp++) {
        const int le = (grp * THREADS + threadIdx.x) * 8;
        const long long e = (long long)blockIdx.x * TILE_ELEMS + le;
        if (e >= n) break;
        const int lb = le / BE;
        float v[8];
        dec_NAME(sm + lb * TB, le - lb * BE, v);
        STORE
    }
}
