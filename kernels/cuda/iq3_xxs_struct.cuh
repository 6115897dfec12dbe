
__shared__ unsigned iq3_grid_shared[256 * GSTRIDE];
struct Iq3XxsBlock {   // d, qs[64] (grid indices, 8 a sub-block), then a word a sub-block: 4x7 sign bits, scale
    static constexpr int BE = 256, TS = 98, CPB = 8;
    struct Raw { unsigned q0, q1, aux; unsigned short d; };
    __device__ static __forceinline__ void init() {
        if (GCOPIES == 0) return;
        for (int i = threadIdx.x; i < 256 * GCOPIES; i += blockDim.x) iq3_grid_shared[i] = IQ3XXS_GRID[i / GSTRIDE];
        __syncthreads();
    }
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* b = row + (c >> 3) * TS;     // blocks are only 2-aligned: 16-bit loads
        const int ib = c & 7;
        r.q0 = ldh<SH>(b + 2 + 8 * ib) | ((unsigned)ldh<SH>(b + 4 + 8 * ib) << 16);
        r.q1 = ldh<SH>(b + 6 + 8 * ib) | ((unsigned)ldh<SH>(b + 8 + 8 * ib) << 16);
        r.aux = ldh<SH>(b + 66 + 4 * ib) | ((unsigned)ldh<SH>(b + 68 + 4 * ib) << 16);
        r.d = ldh<SH>(b);
    }
    __device__ static __forceinline__ int xoff(int c, int k) { return 32 * c + 4 * k; }
    __device__ static __forceinline__ float dot(const Raw& r, int, const float4 (&xv)[8], float, float) {
        const unsigned* gl = GCOPIES > 0 ? iq3_grid_shared + (threadIdx.x % GSTRIDE) : IQ3XXS_GRID;
        return h2f(r.d) * (0.5f + (float)(r.aux >> 28)) * 0.5f * iq3xxs_dot32<GCOPIES>(r.q0, r.q1, r.aux, xv, gl);
    }
};
