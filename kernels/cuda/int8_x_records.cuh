
#ifndef LT_Q8_LAYOUT20   // record layouts by record words (kernels/matvec_q8.py LAYOUTS; a test may set others)
#define LT_Q8_LAYOUT20 0
#endif
#ifndef LT_Q8_LAYOUT24
#define LT_Q8_LAYOUT24 1
#endif
// Where word w (0..RW-1) of chunk c's record lies in a row of quantized x, by the layout of records
// of RW words (20: Q4_K, IQ3_XXS; 24: Q6_K). Layout 0: records one after another (RW c + w).
// Layout 1: the 8 records of a 256-value block interleaved by float4, so that the 8
// lanes walking a block's chunks read 128 contiguous bytes a float4 (a warp's float4 load of layout
// 0 spans 32 records 80 bytes apart: 20 cache lines, against 4).
// RW = 18 (kernels/matvec_mma.py's bands16_product): a block of 8 chunks in 144 words, so that each lane
// of the mma's warp reads its x words of the block's 4 chunk pairs as one 16-byte load, and its runs' d
// as another: word 4 L + p holds lane L's word of chunk pair p (L = 4 (4 (c & 1) + 2 run + lo) + w: its
// B column and k), word 128 + 4 (2 (c & 1) + run) + p the d of chunk 2 p + (c & 1)'s run (w = 16 + run).
template <int RW>
__device__ __forceinline__ int x_record_word(int c, int w) {
    if (RW == 18) {
        const int p = (c & 7) >> 1, h = c & 1;
        if (w >= 16) return (c >> 3) * 144 + 128 + 4 * (2 * h + (w - 16)) + p;
        return (c >> 3) * 144 + 4 * (4 * (4 * h + 2 * ((w >> 2) & 1) + (w >> 3)) + (w & 3)) + p;
    }
    if ((RW == 24 ? LT_Q8_LAYOUT24 : LT_Q8_LAYOUT20) != 0)
        return (c >> 3) * (8 * RW) + (w >> 2) * 32 + (c & 7) * 4 + (w & 3);
    return RW * c + w;
}
// 4 int8 (the low bytes of a..d) in a word, a first.
__device__ __forceinline__ unsigned pack_int8x4(int a, int b, int c, int d) {
    return (unsigned)(a & 0xFF) | ((unsigned)(b & 0xFF) << 8) | ((unsigned)(c & 0xFF) << 16) | ((unsigned)d << 24);
}
// x (n rows of cols floats) -> its records in xq (rows cols floats apart), RW words a chunk. A
// thread a float4 of x, 8 a chunk (4 a run of 16: T::xoff(c, 0..3) and (c, 4..7)), so that a
// 4096-wide x takes 8 CTAs, not one (a thread a chunk made a slow launch).
// Grid (cols / 4 / 128 rounded up, n). T: the type's float struct, whose xoff says which x a chunk
// meets. Words 0-15: hi of run a, hi of run b, lo of run a, lo of run b; then RW = 20 (Q4_K):
// d_a, sum_a, d_b, sum_b; RW = 24 (Q6_K, whose scales go by 8 values): d_a, d_b, the sums of
// the four 8-value halves (float4 pairs 0-1, 2-3, 4-5, 6-7), 2 unused.
// quantize_x_float4: float4 k of chunk c of the row x (its record into the row o, global or shared memory);
// all 8 lanes of a chunk call it together (shuffles), `live` false past the row's end.
template <class T, int RW>
__device__ __forceinline__ void quantize_x_float4(const float* __restrict__ x, unsigned* o, int c, int k, bool live) {
    const float4 v = live ? __ldg((const float4*)(x + T::xoff(c, k))) : make_float4(0.f, 0.f, 0.f, 0.f);
    float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
    const float inv = a > 0.f ? 127.f / a : 0.f;
    const float t4[4] = {v.x * inv, v.y * inv, v.z * inv, v.w * inv};
    int qh[4], ql[4];
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        qh[i] = __float2int_rn(t4[i]);
        ql[i] = __float2int_rn((t4[i] - (float)qh[i]) * 254.f);
    }
    // sums of the quantized values (exact integers, |.| <= 16 * 32385): the minimums (Q4_K) and the
    // -32 offset (Q6_K) then meet the same x as the quants, so the product is W times quantized x exactly
    const int i4 = (254 * qh[0] + ql[0]) + (254 * qh[1] + ql[1]) + (254 * qh[2] + ql[2]) + (254 * qh[3] + ql[3]);
    const int i8 = i4 + __shfl_xor_sync(0xffffffffu, i4, 1);
    const int i16 = i8 + __shfl_xor_sync(0xffffffffu, i8, 2);
    if (!live) return;
    const int run = k >> 2, w = k & 3;
    o[x_record_word<RW>(c, 4 * run + w)] = pack_int8x4(qh[0], qh[1], qh[2], qh[3]);
    o[x_record_word<RW>(c, 8 + 4 * run + w)] = pack_int8x4(ql[0], ql[1], ql[2], ql[3]);
    const float d = a * (1.f / (127.f * 254.f)), s8 = d * (float)i8, s16 = d * (float)i16;
    if constexpr (RW == 18) {
        if (w == 0) o[x_record_word<RW>(c, 16 + run)] = __float_as_uint(d);
    } else if constexpr (RW == 20) {
        if (w == 0) { o[x_record_word<RW>(c, 16 + 2 * run)] = __float_as_uint(d); o[x_record_word<RW>(c, 17 + 2 * run)] = __float_as_uint(s16); }
    } else {
        if (w == 0) o[x_record_word<RW>(c, 16 + run)] = __float_as_uint(d);
        if ((k & 1) == 0) o[x_record_word<RW>(c, 18 + (k >> 1))] = __float_as_uint(s8);
    }
}
template <class T, int RW>
__global__ void __launch_bounds__(128) quantize_x(const float* __restrict__ x, float* __restrict__ xq, int cols) {
    const int chunks = cols / T::BE * T::CPB, t = blockIdx.x * 128 + threadIdx.x;
    const long long row = (long long)blockIdx.y * cols;
    PDL_PROLOGUE();               // x is the previous kernel's output (kernels/pdl.py)
    quantize_x_float4<T, RW>(x + row, (unsigned*)(xq + row), t >> 3, t & 7, (t >> 3) < chunks);   // (no early return)
}
// quantize_x_early (kernels/matvec_mma.py's quantizer):
// quantize_x that lets the next kernel launch before it waits for the previous one, so that a product whose CTAs
// need a whole SM, or that loads weights before its PDL wait (bands16_product), is already queued when the
// product before quantize_x ends.
template <class T, int RW>
__global__ void __launch_bounds__(128) quantize_x_early(const float* __restrict__ x, float* __restrict__ xq, int cols) {
    const int chunks = cols / T::BE * T::CPB, t = blockIdx.x * 128 + threadIdx.x;
    const long long row = (long long)blockIdx.y * cols;
#ifdef LT_PDL
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    quantize_x_float4<T, RW>(x + row, (unsigned*)(xq + row), t >> 3, t & 7, (t >> 3) < chunks);
}
// A float4 of x's record as its four words (packed int8 parts, or a float's bits).
__device__ __forceinline__ uint4 as_uint4(float4 v) {
    return make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z), __float_as_uint(v.w));
}
// 254 * (w . hi) + (w . lo) over 16 weights, 4 bytes a word (q of weights, h and l of x).
__device__ __forceinline__ int dot16_hi_lo(unsigned q0, unsigned q1, unsigned q2, unsigned q3, uint4 h, uint4 l) {
    int sh = __dp4a((int)q0, (int)h.x, 0), sl = __dp4a((int)q0, (int)l.x, 0);
    sh = __dp4a((int)q1, (int)h.y, sh); sl = __dp4a((int)q1, (int)l.y, sl);
    sh = __dp4a((int)q2, (int)h.z, sh); sl = __dp4a((int)q2, (int)l.z, sl);
    sh = __dp4a((int)q3, (int)h.w, sh); sl = __dp4a((int)q3, (int)l.w, sl);
    return sh * 254 + sl;
}
