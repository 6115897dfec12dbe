
#ifndef GCOPIES   // the modules set it first (GRID_COPIES); 0: no shared copy, the grid
#define GCOPIES 0  // read through L1 (Iq3XxsBlock; the register kernel matvec_iq3_xxs keeps one in shared memory)
#endif
#define GSTRIDE (GCOPIES > 0 ? GCOPIES : 1)
// Grid byte j of packed entry e as a float, without the slow int->float conversion unit:
// 0x4B0000bb is 2^23 + bb exactly.
#define GB(e, j) (__int_as_float(__byte_perm((e), 0x4B000000u, 0x7540u | (j))) - 8388608.f)
// x with its sign flipped where bit j of sb is set.
#define SX(v, sb, j) __int_as_float(__float_as_int(v) ^ (((sb) << (31 - (j))) & 0x80000000u))
// 32 IQ3_XXS weights times x, unscaled: grid indices q0, q1 (two a 16-bit half), the sub-block's
// 4x7 sign bits in aux, gl this lane's copy of the grid (shared memory, GS copies interleaved; GS 0:
// the grid itself in global memory, read through L1), x as 8 float4.
template <int GS>
__device__ __forceinline__ float iq3xxs_dot32(unsigned q0, unsigned q1, unsigned aux, const float4* xv,
                                              const unsigned* gl) {
    float sum = 0.f;
    #pragma unroll
    for (int l = 0; l < 4; l++) {   // sign group l: grid entries 2l, 2l+1
        const unsigned sb = ksign((aux >> (7 * l)) & 127u);
        const unsigned qq = (l < 2 ? q0 : q1) >> (16 * (l & 1));
        const unsigned i0 = qq & 255u, i1 = (qq >> 8) & 255u;
        const unsigned g0 = GS ? gl[i0 * GS] : __ldg(gl + i0), g1 = GS ? gl[i1 * GS] : __ldg(gl + i1);
        const float4 a = xv[2 * l], c = xv[2 * l + 1];
        sum = fmaf(GB(g0, 0), SX(a.x, sb, 0), sum); sum = fmaf(GB(g0, 1), SX(a.y, sb, 1), sum);
        sum = fmaf(GB(g0, 2), SX(a.z, sb, 2), sum); sum = fmaf(GB(g0, 3), SX(a.w, sb, 3), sum);
        sum = fmaf(GB(g1, 0), SX(c.x, sb, 4), sum); sum = fmaf(GB(g1, 1), SX(c.y, sb, 5), sum);
        sum = fmaf(GB(g1, 2), SX(c.z, sb, 6), sum); sum = fmaf(GB(g1, 3), SX(c.w, sb, 7), sum);
    }
    return sum;
}
template <int N>
__global__ void __launch_bounds__(128) matvec_iq3_xxs(const unsigned short* __restrict__ w16,
        const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    // GCOPIES copies of the grid, interleaved, so lanes of a warp gathering random entries meet
    // fewer bank conflicts (lane l reads copy l % GCOPIES).
    // GSTRIDE copies: one with GCOPIES 0, the default (faster than 8 copies)
    __shared__ unsigned gs[256 * GSTRIDE];
    for (int i = threadIdx.x; i < 256 * GSTRIDE; i += 128) gs[i] = IQ3XXS_GRID[i / GSTRIDE];
    __syncthreads();
    const unsigned* gl = gs + (threadIdx.x % GSTRIDE);
    const int row0 = blockIdx.x * IQ_ROWS, nsub = cols >> 5;
    const long long row_words = (long long)(cols >> 8) * 49;
    float acc[IQ_ROWS][N];
    #pragma unroll
    for (int r = 0; r < IQ_ROWS; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    for (int s = threadIdx.x; s < nsub; s += 128) {
        const int blk = s >> 3, ib = s & 7;
        unsigned q0[IQ_ROWS], q1[IQ_ROWS], aux[IQ_ROWS];
        float db[IQ_ROWS];
        #pragma unroll
        for (int r = 0; r < IQ_ROWS; r++) {   // rows past the end re-read the last row; never written
            const unsigned short* b = w16 + min(row0 + r, rows - 1) * row_words + blk * 49;
            q0[r] = __ldg(b + 1 + 4 * ib) | ((unsigned)__ldg(b + 2 + 4 * ib) << 16);
            q1[r] = __ldg(b + 3 + 4 * ib) | ((unsigned)__ldg(b + 4 + 4 * ib) << 16);
            aux[r] = __ldg(b + 33 + 2 * ib) | ((unsigned)__ldg(b + 34 + 2 * ib) << 16);
            db[r] = h2f(__ldg(b)) * (0.5f + (float)(aux[r] >> 28)) * 0.5f;
        }
        #pragma unroll
        for (int n = 0; n < N; n++) {
            const float4* xp = (const float4*)(x + (long long)n * cols) + s * 8;
            float4 xv[8];
            #pragma unroll
            for (int k = 0; k < 8; k++) xv[k] = __ldg(xp + k);
            #pragma unroll
            for (int r = 0; r < IQ_ROWS; r++)
                acc[r][n] = fmaf(db[r], iq3xxs_dot32<GSTRIDE>(q0[r], q1[r], aux[r], xv, gl), acc[r][n]);
        }
    }
    finish<N>(acc, out, rows, row0);
}
