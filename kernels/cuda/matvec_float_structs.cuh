
struct TQ4_K {   // d, dmin, scales[12], qs[128]; chunk p = bytes 16p.. of qs: low nibbles are values
    static constexpr int BE = 256, TS = 144, CPB = 8;   // 64j+l0+i, high 64j+32+l0+i (j=p/2, l0=16(p%2))
    struct Raw { uint4 h, q; };
    __device__ static __forceinline__ void init() {}
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* b = row + (c >> 3) * TS;
        r.h = ld16<SH>(b);
        r.q = ld16<SH>(b + 16 + 16 * (c & 7));
    }
    __device__ static __forceinline__ int xoff(int c, int k) {
        const int p = c & 7;
        return (c >> 3) * 256 + 64 * (p >> 1) + 16 * (p & 1) + 32 * (k >> 2) + 4 * (k & 3);
    }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float xa, float xb) {
        const uint4 q = r.q;
        const float sa = dot16(q.x & LO4, q.y & LO4, q.z & LO4, q.w & LO4, xv, 0.f);
        const float sb = dot16((q.x >> 4) & LO4, (q.y >> 4) & LO4, (q.z >> 4) & LO4, (q.w >> 4) & LO4, xv + 4, 0.f);
        return kblock_scales(r.h, (c & 7) >> 1, sa, sb, xa, xb);
    }
};

struct TQ5_K {   // d, dmin, scales[12], qh[32], qs[128]; as Q4_K, with the 5th bit of value 64j+l in
    static constexpr int BE = 256, TS = 176, CPB = 8;   // bit 2j of qh[l] (64j+32+l: bit 2j+1)
    struct Raw { uint4 h, qh, q; };
    __device__ static __forceinline__ void init() {}
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* b = row + (c >> 3) * TS;
        r.h = ld16<SH>(b);
        r.qh = ld16<SH>(b + 16 + 16 * (c & 1));
        r.q = ld16<SH>(b + 48 + 16 * (c & 7));
    }
    __device__ static __forceinline__ int xoff(int c, int k) { return TQ4_K::xoff(c, k); }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float xa, float xb) {
        const int j = (c & 7) >> 1;
        const uint4 q = r.q, h = r.qh;
        #define Q5L(a, b) (((a) & LO4) | ((((b) >> (2 * j)) & 0x01010101u) << 4))
        #define Q5H(a, b) ((((a) >> 4) & LO4) | ((((b) >> (2 * j + 1)) & 0x01010101u) << 4))
        const float sa = dot16(Q5L(q.x, h.x), Q5L(q.y, h.y), Q5L(q.z, h.z), Q5L(q.w, h.w), xv, 0.f);
        const float sb = dot16(Q5H(q.x, h.x), Q5H(q.y, h.y), Q5H(q.z, h.z), Q5H(q.w, h.w), xv + 4, 0.f);
        #undef Q5L
        #undef Q5H
        return kblock_scales(r.h, j, sa, sb, xa, xb);
    }
};

struct TQ6_K {   // ql[128], qh[64], scales[16] int8, d. Chunk p: half h=p/4, l0=8(p%4), 8 values of each
    static constexpr int BE = 256, TS = 210, CPB = 8;   // run t=0..3 at 128h+32t+l0 (see dot)
    struct Raw { unsigned a[3], b[3], h[3], s[3]; unsigned short d; unsigned sh; };
    __device__ static __forceinline__ void init() {}
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* blk = row + (c >> 3) * TS;
        const int p = c & 7, hf = p >> 2, l0 = 8 * (p & 3);
        const unsigned m = (unsigned)((unsigned long long)blk & 3u);          // 0 or 2: blocks are 210 bytes
        const unsigned char* b = blk - m;                         // every field below is 8-aligned in the block
        #pragma unroll
        for (int i = 0; i < 3; i++) {
            r.a[i] = ldw<SH>(b + 64 * hf + l0 + 4 * i);
            r.b[i] = ldw<SH>(b + 64 * hf + 32 + l0 + 4 * i);
            r.h[i] = ldw<SH>(b + 128 + 32 * hf + l0 + 4 * i);
            r.s[i] = ldw<SH>(b + 192 + 8 * hf + 4 * i);
        }
        r.d = ldh<SH>(blk + 208);
        r.sh = 8 * m;
    }
    __device__ static __forceinline__ int xoff(int c, int k) {
        const int p = c & 7;
        return (c >> 3) * 256 + 128 * (p >> 2) + 8 * (p & 3) + 32 * (k >> 1) + 4 * (k & 1);
    }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float, float) {
        const unsigned a0 = __funnelshift_r(r.a[0], r.a[1], r.sh), a1 = __funnelshift_r(r.a[1], r.a[2], r.sh);
        const unsigned b0 = __funnelshift_r(r.b[0], r.b[1], r.sh), b1 = __funnelshift_r(r.b[1], r.b[2], r.sh);
        const unsigned h0 = __funnelshift_r(r.h[0], r.h[1], r.sh), h1 = __funnelshift_r(r.h[1], r.h[2], r.sh);
        // scales[8h .. 8h+7] flipped to unsigned (x ^ 0x80 = x + 128); run t uses byte e + 2t
        const unsigned s0 = __funnelshift_r(r.s[0], r.s[1], r.sh) ^ 0x80808080u;
        const unsigned s1 = __funnelshift_r(r.s[1], r.s[2], r.sh) ^ 0x80808080u;
        const int e = (c & 2) >> 1;   // l0 >= 16
        const float t0 = dot8((a0 & LO4) | ((h0 << 4) & 0x30303030u), (a1 & LO4) | ((h1 << 4) & 0x30303030u), xv, 32.f);
        const float t1 = dot8((b0 & LO4) | ((h0 << 2) & 0x30303030u), (b1 & LO4) | ((h1 << 2) & 0x30303030u), xv + 2, 32.f);
        const float t2 = dot8(((a0 >> 4) & LO4) | (h0 & 0x30303030u), ((a1 >> 4) & LO4) | (h1 & 0x30303030u), xv + 4, 32.f);
        const float t3 = dot8(((b0 >> 4) & LO4) | ((h0 >> 2) & 0x30303030u), ((b1 >> 4) & LO4) | ((h1 >> 2) & 0x30303030u), xv + 6, 32.f);
        const float s = BF(s0, e, 128.f) * t0 + BF(s0, e + 2, 128.f) * t1 + BF(s1, e, 128.f) * t2 + BF(s1, e + 2, 128.f) * t3;
        return half_bits_to_float(r.d) * s;
    }
};

struct TQ4_0 {   // d, qs[16]: value i = (qs[i] & 15) - 8, value 16+i = (qs[i] >> 4) - 8; a chunk is a block
    static constexpr int BE = 32, TS = 18, CPB = 1;
    struct Raw { unsigned w[5]; unsigned m; };
    __device__ static __forceinline__ void init() {}
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* blk = row + c * TS;
        r.m = (unsigned)((unsigned long long)blk & 3u);
        #pragma unroll
        for (int i = 0; i < 5; i++) r.w[i] = ldw<SH>(blk - r.m + 4 * i);
    }
    __device__ static __forceinline__ int xoff(int c, int k) { return 32 * c + 4 * k; }
    __device__ static __forceinline__ float dot(const Raw& r, int, const float4 (&xv)[8], float, float) {
        const unsigned sh = 16 + 8 * r.m;   // qs start 2 bytes into the block; shift 32 = next word
        unsigned q[4];
        #pragma unroll
        for (int i = 0; i < 4; i++) q[i] = __funnelshift_rc(r.w[i], r.w[i + 1], sh);
        const float s = dot16(q[0] & LO4, q[1] & LO4, q[2] & LO4, q[3] & LO4, xv, 8.f)
                      + dot16((q[0] >> 4) & LO4, (q[1] >> 4) & LO4, (q[2] >> 4) & LO4, (q[3] >> 4) & LO4, xv + 4, 8.f);
        return half_bits_to_float((unsigned short)(r.m ? (r.w[0] >> 16) : (r.w[0] & 0xFFFFu))) * s;
    }
};

struct TQ8_0 {   // d, qs[32] int8; a chunk is a block
    static constexpr int BE = 32, TS = 34, CPB = 1;
    struct Raw { unsigned w[9]; unsigned m; };
    __device__ static __forceinline__ void init() {}
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* blk = row + c * TS;
        r.m = (unsigned)((unsigned long long)blk & 3u);
        #pragma unroll
        for (int i = 0; i < 9; i++) r.w[i] = ldw<SH>(blk - r.m + 4 * i);
    }
    __device__ static __forceinline__ int xoff(int c, int k) { return 32 * c + 4 * k; }
    __device__ static __forceinline__ float dot(const Raw& r, int, const float4 (&xv)[8], float, float) {
        const unsigned sh = 16 + 8 * r.m;
        unsigned q[8];   // int8 ^ 0x80 = value + 128
        #pragma unroll
        for (int i = 0; i < 8; i++) q[i] = __funnelshift_rc(r.w[i], r.w[i + 1], sh) ^ 0x80808080u;
        const float s = dot16(q[0], q[1], q[2], q[3], xv, 128.f) + dot16(q[4], q[5], q[6], q[7], xv + 4, 128.f);
        return half_bits_to_float((unsigned short)(r.m ? (r.w[0] >> 16) : (r.w[0] & 0xFFFFu))) * s;
    }
};

#define BH(w, j) __int_as_float(__byte_perm((w), 0x3F000000u, 0x7054u | ((j) << 8)))
__device__ __forceinline__ float dot16h(unsigned a, unsigned b, unsigned c, unsigned d, const float4* xv, float xs) {
    const unsigned q[4] = {a, b, c, d};
    float s = 0.f;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        s = fmaf(BH(q[k], 0), xv[k].x, s); s = fmaf(BH(q[k], 1), xv[k].y, s);
        s = fmaf(BH(q[k], 2), xv[k].z, s); s = fmaf(BH(q[k], 3), xv[k].w, s);
    }
    return fmaf(256.f, s, -128.f * xs);
}
struct TQ4_KH : TQ4_K {   // TQ4_K's loads and layout; the dot above for both nibble runs
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float xa, float xb) {
        const uint4 q = r.q;
        const float sa = dot16h(q.x & LO4, q.y & LO4, q.z & LO4, q.w & LO4, xv, xa);
        const float sb = dot16h((q.x >> 4) & LO4, (q.y >> 4) & LO4, (q.z >> 4) & LO4, (q.w >> 4) & LO4, xv + 4, xb);
        return kblock_scales(r.h, (c & 7) >> 1, sa, sb, xa, xb);
    }
};
