struct TQ4_KQ : TQ4_K {   // TQ4_K's weights; x as quantize_x's records
    __device__ static __forceinline__ int xoff(int c, int k) { return x_record_word<20>(c, 4 * k); }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float, float) {
        const uint4 q = r.q, f = as_uint4(xv[4]);
        const float sa = __uint_as_float(f.x) * (float)dot16_hi_lo(q.x & LO4, q.y & LO4, q.z & LO4, q.w & LO4,
                                                                     as_uint4(xv[0]), as_uint4(xv[2]));
        const float sb = __uint_as_float(f.z) * (float)dot16_hi_lo((q.x >> 4) & LO4, (q.y >> 4) & LO4, (q.z >> 4) & LO4,
                                                                     (q.w >> 4) & LO4, as_uint4(xv[1]), as_uint4(xv[3]));
        return kblock_scales(r.h, (c & 7) >> 1, sa, sb, __uint_as_float(f.y), __uint_as_float(f.w));
    }
};
// 254 * (w . hi) + (w . lo) over 8 weights (2 words).
__device__ __forceinline__ int dot8_hi_lo(unsigned q0, unsigned q1, unsigned h0, unsigned h1, unsigned l0, unsigned l1) {
    const int sh = __dp4a((int)q1, (int)h1, __dp4a((int)q0, (int)h0, 0));
    const int sl = __dp4a((int)q1, (int)l1, __dp4a((int)q0, (int)l0, 0));
    return sh * 254 + sl;   // |.| <= 8 * 63 * 127 * 255 < 2^24: exact as a float too
}
struct TQ6_KQ : TQ6_K {   // TQ6_K's weights (values q in 0..63, q - 32 each); x as quantize_x<TQ6_K, 24>'s records
    __device__ static __forceinline__ int xoff(int c, int k) { return x_record_word<24>(c, 4 * k); }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float, float) {
        const unsigned a0 = __funnelshift_r(r.a[0], r.a[1], r.sh), a1 = __funnelshift_r(r.a[1], r.a[2], r.sh);
        const unsigned b0 = __funnelshift_r(r.b[0], r.b[1], r.sh), b1 = __funnelshift_r(r.b[1], r.b[2], r.sh);
        const unsigned h0 = __funnelshift_r(r.h[0], r.h[1], r.sh), h1 = __funnelshift_r(r.h[1], r.h[2], r.sh);
        const unsigned sc0 = __funnelshift_r(r.s[0], r.s[1], r.sh) ^ 0x80808080u;   // as TQ6_K::dot
        const unsigned sc1 = __funnelshift_r(r.s[1], r.s[2], r.sh) ^ 0x80808080u;
        const int e = (c & 2) >> 1;
        const uint4 ha = as_uint4(xv[0]), hb = as_uint4(xv[1]), la = as_uint4(xv[2]), lb = as_uint4(xv[3]);
        const uint4 f = as_uint4(xv[4]), g = as_uint4(xv[5]);
        const float da = __uint_as_float(f.x), db = __uint_as_float(f.y);
        // run t: its 8 values' dot with x, less 32 * (the run's sum of x)
        const float r0 = fmaf(da, (float)dot8_hi_lo((a0 & LO4) | ((h0 << 4) & 0x30303030u), (a1 & LO4) | ((h1 << 4) & 0x30303030u),
                                                  ha.x, ha.y, la.x, la.y), -32.f * __uint_as_float(f.z));
        const float r1 = fmaf(da, (float)dot8_hi_lo((b0 & LO4) | ((h0 << 2) & 0x30303030u), (b1 & LO4) | ((h1 << 2) & 0x30303030u),
                                                  ha.z, ha.w, la.z, la.w), -32.f * __uint_as_float(f.w));
        const float r2 = fmaf(db, (float)dot8_hi_lo(((a0 >> 4) & LO4) | (h0 & 0x30303030u), ((a1 >> 4) & LO4) | (h1 & 0x30303030u),
                                                  hb.x, hb.y, lb.x, lb.y), -32.f * __uint_as_float(g.x));
        const float r3 = fmaf(db, (float)dot8_hi_lo(((b0 >> 4) & LO4) | ((h0 >> 2) & 0x30303030u), ((b1 >> 4) & LO4) | ((h1 >> 2) & 0x30303030u),
                                                  hb.z, hb.w, lb.z, lb.w), -32.f * __uint_as_float(g.y));
        const float s = BF(sc0, e, 128.f) * r0 + BF(sc0, e + 2, 128.f) * r1 + BF(sc1, e, 128.f) * r2 + BF(sc1, e + 2, 128.f) * r3;
        return half_bits_to_float(r.d) * s;
    }
};
