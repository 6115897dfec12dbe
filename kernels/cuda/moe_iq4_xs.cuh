// IQ4_XS as a type of the MoE products (the IQ3_XXS one is kernels/matvec_iq.py's Iq3XxsBlock). The
// decode is matvec_iq's matvec_iq4_xs, a chunk = a 32-weight sub-block; the 16 levels sit in shared
// memory. Blocks are 136 bytes, so with an 8-aligned base every block and its qs (at 8 + 16 ib)
// are 8-aligned: uint2 loads.
__shared__ float iq4_levels_shared[16];
struct Iq4XsBlock {   // d (f16), scales_h (u16), scales_l[4], qs[128]; sub-block ib: 16 bytes at 8 + 16 ib,
                   // low nibbles are values 0..15, high nibbles 16..31; 6-bit scale (low 4 | high 2 << 4) - 32
    static constexpr int BE = 256, TS = 136, CPB = 8;
    struct Raw { uint2 lo, hi; unsigned w0, w1; };
    __device__ static __forceinline__ void init() {
        if (threadIdx.x < 16) iq4_levels_shared[threadIdx.x] = (float)IQ4_KVALUES[threadIdx.x];
        __syncthreads();
    }
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* b = row + (c >> 3) * TS;
        const int ib = c & 7;
        r.lo = __ldg((const uint2*)(b + 8 + 16 * ib));
        r.hi = __ldg((const uint2*)(b + 16 + 16 * ib));
        r.w0 = __ldg((const unsigned*)b);
        r.w1 = __ldg((const unsigned*)(b + 4));
    }
    __device__ static __forceinline__ int xoff(int c, int k) { return 32 * c + 4 * k; }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float, float) {
        const int ib = c & 7;
        const int ls = (int)(((r.w1 >> (8 * (ib >> 1) + 4 * (ib & 1))) & 15u) | (((r.w0 >> (16 + 2 * ib)) & 3u) << 4));
        const unsigned qw[4] = {r.lo.x, r.lo.y, r.hi.x, r.hi.y};
        return h2f((unsigned short)(r.w0 & 0xffffu)) * (float)(ls - 32) * iq4_dot32(qw, xv, iq4_levels_shared);
    }
};
