// IQ3_XXS_B16's decode product on the tensor cores (kernels/matvec_mma.py's bands16_product / bands16_product_fused_end), after
// matvec_q8.c_source("IQ3_XXS") (its x quantizer quantize_x_early, x_record_word, byte_sign_masks and the grid IQ3XXS_GRID).
// First the halves of a word of two fp16 (band_low_half_to_float / band_high_half_to_float), then the int8 mma and the tables.

__device__ __forceinline__ float band_low_half_to_float(unsigned v) { return half_bits_to_float((unsigned short)(v & 0xFFFFu)); }
__device__ __forceinline__ float band_high_half_to_float(unsigned v) { return half_bits_to_float((unsigned short)(v >> 16)); }


#ifdef __CUDA_ARCH__
// C (int32, 16 x 8) = A (16 rows x 32 int8) B (32 x 8 int8) (+ C): lane 4g + q holds A's rows g, g + 8
// at k = 4q..4q+3 (a0, a1) and 16 + 4q.. (a2, a3), B's column g at the same k (b.x, b.y), C's rows
// g, g + 8 at columns 2q, 2q + 1.
__device__ __forceinline__ void band_int8_mma(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, uint2 b, bool acc) {
    if (acc)
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
    else
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
            : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y), "r"(0));
}
#else   // the host emulator (tests/cuda_c_emulator.py): the warp's fragments exchanged, each lane its C
inline unsigned __vsub4(unsigned a, unsigned b) {   // bytewise a - b, each byte modulo 256
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (((a >> (8 * i)) - (b >> (8 * i))) & 0xFFu) << (8 * i);
    return r;
}
inline void band_int8_mma(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, uint2 b, bool acc) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    unsigned* mine = tl_warp->mma[lane];
    mine[0] = a0; mine[1] = a1; mine[2] = a2; mine[3] = a3; mine[4] = b.x; mine[5] = b.y;
    tl_warp->bar->arrive_and_wait();
    auto byte = [](unsigned v, int i) { return (int)(signed char)(v >> (8 * i)); };
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
        int s = acc ? c[i] : 0;
        for (int k = 0; k < 32; k++) {
            const unsigned* al = tl_warp->mma[4 * (row & 7) + ((k & 15) >> 2)];
            const unsigned* bl = tl_warp->mma[4 * col + ((k & 15) >> 2)];
            s += byte(al[(row >= 8) + 2 * (k >= 16)], k & 3) * byte(bl[4 + (k >= 16)], k & 3);
        }
        c[i] = s;
    }
    tl_warp->bar->arrive_and_wait();
}
#endif
#include "iq3_signed_grid_words.cuh"
struct BandRecord { uint4 f[3]; uint2 sc; unsigned d; };   // a lane's part of a record
// The weights stream through L2 once a product: loaded with an evict-first policy, so that they
// do not push out what the next kernels read (x, its records, the outputs, the KV cache).
// BANDS16_NO_EVICT_FIRST: plain loads (the A/B's baseline).
#if defined(__CUDA_ARCH__) && !defined(BANDS16_NO_EVICT_FIRST)
struct BandWeightStream {
    unsigned long long pol;
    __device__ __forceinline__ BandWeightStream() { asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol)); }
    __device__ __forceinline__ uint4 u4(const void* p) const {
        uint4 v;
        asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
        return v;
    }
    __device__ __forceinline__ uint2 u2(const void* p) const {
        uint2 v;
        asm("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;" : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(pol));
        return v;
    }
    __device__ __forceinline__ unsigned u1(const void* p) const {
        unsigned v;
        asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(pol));
        return v;
    }
};
#else
struct BandWeightStream {
    __device__ __forceinline__ uint4 u4(const void* p) const { return __ldg((const uint4*)p); }
    __device__ __forceinline__ uint2 u2(const void* p) const { return __ldg((const uint2*)p); }
    __device__ __forceinline__ unsigned u1(const void* p) const { return __ldg((const unsigned*)p); }
};
#endif
__device__ __forceinline__ void band_load_record(BandRecord& r, const unsigned char* rec, int lane, const BandWeightStream& ls) {
    #pragma unroll
    for (int p = 0; p < 3; p++) r.f[p] = ls.u4((const uint4*)(rec + 512 * p) + lane);
    r.sc = ls.u2((const uint2*)(rec + 1536) + (lane >> 2));
    r.d = ls.u1((const unsigned*)(rec + 1600) + (lane >> 2));
}
__device__ __forceinline__ unsigned band_record_word(const BandRecord& r, int i) {
    const uint4 v = r.f[i >> 2];
    return (i & 3) == 0 ? v.x : (i & 3) == 1 ? v.y : (i & 3) == 2 ? v.z : v.w;
}
// field n's byte offset in the table, (field << 2) & 0x3FFC (n a constant once unrolled: 2 instructions)
__device__ __forceinline__ unsigned band_signed_offset(const BandRecord& r, int n) {
    const int bit = 12 * n, wi = bit >> 5, sh = bit & 31;
    if (sh > 20) return __funnelshift_r(band_record_word(r, wi), band_record_word(r, wi + 1), sh - 2) & 0x3FFCu;
    return (sh >= 2 ? band_record_word(r, wi) >> (sh - 2) : band_record_word(r, wi) << (2 - sh)) & 0x3FFCu;
}
// The tables, at file scope (through pointers passed in, the compiler added a shared window base to each
// x address as well). The signed table aligned at every shape lost at 14336x4096 (64 KB a CTA: 3 CTAs an SM
// of 4 warps where 4 fit); A = 1 below takes it where it fits.
__shared__ uint4 band_signed_table[1024];                        // LT_TAB4096; then (the products done) the warps' sums
__shared__ uint4 band_grid_copies[2048];                     // entry e's copy l at word 32 e + l
// A = 1: the signed table 16 KB aligned in dynamic shared memory (ALIGN_DYN bytes), tb its shared
// address, so that a lookup's address is one LOP3 ((field << 2) & 0x3FFC | tb), not that and an add of the
// base (SASS 257 instructions a block against 270). 65 KB a CTA: where 2 CTAs of 8 warps or 3 of 4 fit the
// product's CTAs in one round (config). The emulator reads the static table either way.
#ifdef __CUDA_ARCH__
extern __shared__ uint4 band_aligned_smem[];
#endif
template <int ALIGNED_TABLE>
__device__ __forceinline__ uint4* band_signed_table_ptr(unsigned& tb) {
#ifdef __CUDA_ARCH__
    if constexpr (ALIGNED_TABLE != 0) {
        const unsigned s = (unsigned)__cvta_generic_to_shared(band_aligned_smem);
        tb = (s + 0x3FFFu) & ~0x3FFFu;
        return band_aligned_smem + ((tb - s) >> 4);
    } else
#endif
    {
        tb = 0;
        return band_signed_table;
    }
}
template <int ALIGNED_TABLE>
__device__ __forceinline__ unsigned band_signed_word(unsigned off, unsigned tb) {
#ifdef __CUDA_ARCH__
    if constexpr (ALIGNED_TABLE != 0) {
        unsigned v;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(off | tb));
        return v;
    } else
#endif
    return *(const unsigned*)((const unsigned char*)band_signed_table + off);
}
// BandXFragments: a lane's x for the block, its x word and its run's d in each chunk pair (quantize_x_early<Iq3XxsBlock, 18>'s
// records, kernels/matvec_q8.py x_record_word: 144 words a block, a lane's 4 words and 4 d in 16 bytes each).
struct BandXFragments {
    unsigned v[4], d[4];
    __device__ __forceinline__ void load(const unsigned* xj, int lane) {
        const uint4 a = __ldg((const uint4*)xj + lane), b = __ldg((const uint4*)(xj + 128) + (lane & 3));
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; d[0] = b.x; d[1] = b.y; d[2] = b.z; d[3] = b.w;
    }
};
// A block's A fragments, what of its product needs no x (band_decode_a): the even chunks' words from the
// signed table (e), the odd chunks' from the grid's copies with their signs XORed on (o) and, SG = 0, the sign masks
// for the correction mma (m); the scales and d as loaded.
struct BandAFragments { unsigned e[4][4], o[4][4], m[4][4]; uint2 sc; unsigned d; };
template <int ALIGNED_TABLE, int SIGNS_ADD>
__device__ __forceinline__ void band_decode_a(const BandRecord& r, int lane, unsigned tb, BandAFragments& a) {
    #pragma unroll
    for (int cp = 0; cp < 4; cp++) {                      // chunk pairs c, c + 1
        #pragma unroll
        for (int k = 0; k < 4; k++) a.e[cp][k] = band_signed_word<ALIGNED_TABLE>(band_signed_offset(r, 4 * cp + k), tb);
        const unsigned iw = band_record_word(r, 6 + cp);
        #pragma unroll
        for (int k = 0; k < 4; k++) {                     // the odd chunk: grid copy, signs by XOR
            const int n = 4 * cp + k;
            const unsigned idx = (iw >> (8 * k)) & 255u;
            const unsigned m = byte_sign_masks(band_record_word(r, 10 + (n >> 3)) << (7 - (n & 7)));
            unsigned o = *(const unsigned*)((const unsigned char*)band_grid_copies + idx * 128 + 4 * lane) ^ m;
            if (SIGNS_ADD) o += m & 0x01010101u;                 // SG: -g exactly ((g ^ 0xFF) + 1; g <= 62: no carry)
            a.o[cp][k] = o;
            a.m[cp][k] = m;
        }
    }
    a.sc = r.sc;
    a.d = r.d;
}
// The block's product with x: per chunk pair the even chunk's mma, the odd chunk's (and, SG = 0, its correction
// against -x), then the pair's tail into acc0 / acc1 (rows g, g + 8).
template <int SIGNS_ADD>
__device__ __forceinline__ void band_multiply_x(const BandAFragments& a, const BandXFragments& x, int qh, unsigned m0, unsigned m1, unsigned ma,
                                           float& acc0, float& acc1) {
    float blk0 = 0.f, blk1 = 0.f;
    #pragma unroll
    for (int cp = 0; cp < 4; cp++) {
        const unsigned v = x.v[cp];
        const unsigned vn = __vsub4(0u, v);               // -x (|x| <= 127: no wrap)
        const float dx = __uint_as_float(x.d[cp]);
        int cc[4];
        band_int8_mma(cc, a.e[cp][0], a.e[cp][1], a.e[cp][2], a.e[cp][3], make_uint2(v & m0 & ma, v & m1 & ma), false);
        band_int8_mma(cc, a.o[cp][0], a.o[cp][1], a.o[cp][2], a.o[cp][3], make_uint2(v & m0 & ~ma, v & m1 & ~ma), true);
        if (!SIGNS_ADD) band_int8_mma(cc, a.m[cp][0], a.m[cp][1], a.m[cp][2], a.m[cp][3], make_uint2(vn & m0 & ~ma, vn & m1 & ~ma), true);
        // 2 sc of this lane's chunk (2 cp + qh of the block) for rows g, g + 8; the tail: d_x (254 hi + lo) (2 sc + 1)
        const unsigned s0q = a.sc.x >> (4 * qh), s1q = a.sc.y >> (4 * qh);
        const int s0 = (cp == 0 ? s0q << 1 : s0q >> (8 * cp - 1)) & 0x1E, s1 = (cp == 0 ? s1q << 1 : s1q >> (8 * cp - 1)) & 0x1E;
        const int t0 = cc[0] * 254 + cc[1], t1 = cc[2] * 254 + cc[3];
        blk0 = fmaf(dx, (float)(t0 * s0 + t0), blk0);
        blk1 = fmaf(dx, (float)(t1 * s1 + t1), blk1);
    }
    acc0 = fmaf(band_low_half_to_float(a.d), blk0, acc0);
    acc1 = fmaf(band_high_half_to_float(a.d), blk1, acc1);
}
// One block of 256 columns of a band in one (the loop's form: band_decode_a + band_multiply_x's text as one, which
// ptxas schedules into 880 SASS instructions for bands16_product<8, 1, 1, 0> against 912 as the two's calls): 4 chunk pairs, each
// the even chunk's mma through the signed table and the odd chunk's two through the grid's copies, then the pair's
// tail into acc0 / acc1 (rows g, g + 8).
template <int ALIGNED_TABLE, int SIGNS_ADD>
__device__ __forceinline__ void band_block_product(const BandRecord& r, const BandXFragments& x, int lane, int qh, unsigned tb,
                                             unsigned m0, unsigned m1, unsigned ma, float& acc0, float& acc1) {
    float blk0 = 0.f, blk1 = 0.f;
    #pragma unroll
    for (int cp = 0; cp < 4; cp++) {                      // chunk pairs c, c + 1
        const unsigned v = x.v[cp];
        const unsigned vn = __vsub4(0u, v);               // -x (|x| <= 127: no wrap)
        const float dx = __uint_as_float(x.d[cp]);
        int cc[4];
        band_int8_mma(cc, band_signed_word<ALIGNED_TABLE>(band_signed_offset(r, 4 * cp), tb), band_signed_word<ALIGNED_TABLE>(band_signed_offset(r, 4 * cp + 1), tb),
                    band_signed_word<ALIGNED_TABLE>(band_signed_offset(r, 4 * cp + 2), tb), band_signed_word<ALIGNED_TABLE>(band_signed_offset(r, 4 * cp + 3), tb),
                    make_uint2(v & m0 & ma, v & m1 & ma), false);
        unsigned a[4], m[4];
        const unsigned iw = band_record_word(r, 6 + cp);
        #pragma unroll
        for (int k = 0; k < 4; k++) {                     // the odd chunk: grid copy, signs by XOR
            const int n = 4 * cp + k;
            const unsigned idx = (iw >> (8 * k)) & 255u;
            m[k] = byte_sign_masks(band_record_word(r, 10 + (n >> 3)) << (7 - (n & 7)));
            a[k] = *(const unsigned*)((const unsigned char*)band_grid_copies + idx * 128 + 4 * lane) ^ m[k];
            if (SIGNS_ADD) a[k] += m[k] & 0x01010101u;           // SG: -g exactly ((g ^ 0xFF) + 1; g <= 62: no carry)
        }
        band_int8_mma(cc, a[0], a[1], a[2], a[3], make_uint2(v & m0 & ~ma, v & m1 & ~ma), true);
        if (!SIGNS_ADD) band_int8_mma(cc, m[0], m[1], m[2], m[3], make_uint2(vn & m0 & ~ma, vn & m1 & ~ma), true);
        // 2 sc of this lane's chunk (2 cp + qh of the block) for rows g, g + 8; the tail: d_x (254 hi + lo) (2 sc + 1)
        const unsigned s0q = r.sc.x >> (4 * qh), s1q = r.sc.y >> (4 * qh);
        const int s0 = (cp == 0 ? s0q << 1 : s0q >> (8 * cp - 1)) & 0x1E, s1 = (cp == 0 ? s1q << 1 : s1q >> (8 * cp - 1)) & 0x1E;
        const int t0 = cc[0] * 254 + cc[1], t1 = cc[2] * 254 + cc[3];
        blk0 = fmaf(dx, (float)(t0 * s0 + t0), blk0);
        blk1 = fmaf(dx, (float)(t1 * s1 + t1), blk1);
    }
    acc0 = fmaf(band_low_half_to_float(r.d), blk0, acc0);
    acc1 = fmaf(band_high_half_to_float(r.d), blk1, acc1);
}
// bands16_product<W, P, A, SG>: a CTA of W warps a band; warp w takes blocks w, w + W, ..., P of them loaded ahead (the
// first before the PDL wait); A: the signed table aligned in dynamic shared memory (band_signed_table_ptr); out = x W^T
// for one row of x, quantized by quantize_x_early<Iq3XxsBlock, 18> (xq). Of each chunk pair, the even chunk's words come from
// the signed table (4096 words: ~3.5-way bank conflicts), the odd chunk's from the unsigned grid's 32 copies,
// lane l's in bank l, its signs put on by XOR with byte masks (g ^ m: g or -g - 1) and taken back by a second
// mma of the masks against -x (faster than every word from the table), or (SG = 1) by adding the masks' low bits.
#ifdef BANDS16_STAMPS   // a timeline of the CTAs (profiling): thread 0's globaltimer, its SM
__device__ unsigned long long band_stamps[64][4096][8];     // [launch][CTA][event]
__device__ unsigned band_stamp_launches[4096];
#define BANDS16_STAMP(k) do { if (threadIdx.x == 0) { unsigned long long t_; \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); band_stamps[stamp_n & 63][blockIdx.x][k] = t_; \
    unsigned sm_; asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_)); band_stamps[stamp_n & 63][blockIdx.x][7] = sm_; } } while (0)
#else
#define BANDS16_STAMP(k) do { } while (0)
#endif
