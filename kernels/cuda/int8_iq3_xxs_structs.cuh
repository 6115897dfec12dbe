
#include "iq3_sign_masks.cuh"
// GC: copies of the grid in shared memory, interleaved (lane l reads copy l % GC; 0: the grid read
// through L1); SC: the sign masks read through L1 (0), from shared memory (1) or computed (2: parity
// by __popc, 4 sign bits to 4 byte masks by one multiply). Why: a warp's 32 random lookups through
// L1 touch most of a 1 KB table's 8 lines, about a cycle of L1 each, 12 lookups a row and chunk, so
// both tables through L1 left the product L1-bound; (1, 2) is the fastest placement measured. A 16 KB
// shared table of every grid entry under every 4 signs lost (bank conflicts).
template <int GC, int SC>
struct Iq3XxsBlockInt8X : Iq3XxsBlock {   // Iq3XxsBlock's block layout, Raw and loads; x as quantize_x<Iq3XxsBlock, 20>'s records
    __device__ static __forceinline__ unsigned* tables() {
        __shared__ uint4 t[(GC > 0 ? 64 * GC : 0) + (SC == 1 ? 64 : 0) + 1];   // uint4: 16-byte aligned
        return (unsigned*)t;
    }
    __device__ static __forceinline__ void init() {
        if constexpr (GC >= 8 && SC != 1) {
            // Many copies filled with the loads first (a thread's entries, then its copies as 16-byte
            // stores, lane l starting at copy group l: 4 wavefronts a warp's store): the loop below waits a
            // global load per store, which made many copies look slow. (blockDim.x >= 128: 256 entries in two.)
            unsigned* t = tables();
            unsigned g[2];
            #pragma unroll
            for (int k = 0; k < 2; k++) {
                const unsigned e = threadIdx.x + k * blockDim.x;
                g[k] = e < 256 ? __ldg(IQ3XXS_GRID64 + e) : 0u;
            }
            #pragma unroll
            for (int k = 0; k < 2; k++) {
                const unsigned e = threadIdx.x + k * blockDim.x;
                if (e < 256)
                    #pragma unroll
                    for (int j = 0; j < GC / 4; j++)
                        ((uint4*)t)[e * (GC / 4) + ((j + threadIdx.x) & (GC / 4 - 1))] = make_uint4(g[k], g[k], g[k], g[k]);
            }
            __syncthreads();
        } else if constexpr (GC > 0 || SC == 1) {
            unsigned* t = tables();
            for (int i = threadIdx.x; i < 256 * GC; i += blockDim.x) t[i] = IQ3XXS_GRID64[i / (GC > 0 ? GC : 1)];
            if constexpr (SC == 1)
                for (int i = threadIdx.x; i < 256; i += blockDim.x) t[256 * GC + i] = ((const unsigned*)IQ3XXS_SMASK2)[i];
            __syncthreads();
        }
    }
    __device__ static __forceinline__ unsigned grid(unsigned i) {
        if constexpr (GC > 0) return tables()[i * GC + (threadIdx.x & (GC - 1))];
        else return __ldg(IQ3XXS_GRID64 + i);
    }
    __device__ static __forceinline__ uint2 masks(unsigned e) {   // e: the 7 stored sign bits
        if constexpr (SC == 0) return __ldg(IQ3XXS_SMASK2 + e);
        else if constexpr (SC == 1) return ((const uint2*)(tables() + 256 * GC))[e];
        else {
            const unsigned s = e | ((__popc(e) & 1u) << 7);   // the 8th sign: even parity
            // 4 bits b0..b3 -> bytes b0, b1, b2, b3: s4 * 0x204081 puts bit j at bit 8j (no carries)
            return make_uint2(((s & 15u) * 0x204081u & 0x01010101u) * 0x3Fu, ((s >> 4) * 0x204081u & 0x01010101u) * 0x3Fu);
        }
    }
    __device__ static __forceinline__ int xoff(int c, int k) { return x_record_word<20>(c, 4 * k); }
    __device__ static __forceinline__ float dot(const Raw& r, int, const float4 (&xv)[8], float, float) {
        const uint4 f = as_uint4(xv[4]);
        const uint4 hx[2] = {as_uint4(xv[0]), as_uint4(xv[1])}, lx[2] = {as_uint4(xv[2]), as_uint4(xv[3])};
        int sh[2] = {0, 0}, sl[2] = {0, 0};
        #pragma unroll
        for (int l = 0; l < 4; l++) {   // sign group l: grid entries 2l, 2l+1, values 8l..8l+7 (run l / 2)
            const unsigned qq = (l < 2 ? r.q0 : r.q1) >> (16 * (l & 1));
            const unsigned e = (r.aux >> (7 * l)) & 127u;
            unsigned u0 = grid(qq & 255u), u1 = grid((qq >> 8) & 255u);
            const uint2 m = masks(e);
            u0 -= 2u * (u0 & m.x);
            u1 -= 2u * (u1 & m.y);
            const int h = l >> 1;
            const unsigned h0 = (l & 1) ? hx[h].z : hx[h].x, h1 = (l & 1) ? hx[h].w : hx[h].y;
            const unsigned l0 = (l & 1) ? lx[h].z : lx[h].x, l1 = (l & 1) ? lx[h].w : lx[h].y;
            sh[h] = __dp4a((int)u1, (int)h1, __dp4a((int)u0, (int)h0, sh[h]));
            sl[h] = __dp4a((int)u1, (int)l1, __dp4a((int)u0, (int)l0, sl[h]));
        }
        const float ra = fmaf(__uint_as_float(f.x), fmaf(254.f, (float)sh[0], (float)sl[0]), -64.f * __uint_as_float(f.y));
        const float rb = fmaf(__uint_as_float(f.z), fmaf(254.f, (float)sh[1], (float)sl[1]), -64.f * __uint_as_float(f.w));
        return h2f(r.d) * (0.5f + (float)(r.aux >> 28)) * 0.5f * (ra + rb);
    }
};
// The same decode over IQ3_XXS_G4 weights (kernels/iq3_groups.py): per row, groups of 4 blocks (a warp's 32 chunks) as [64 x 4
// bytes of grid indices][32 sign words][4 scale words][4 d], 408 bytes. A lane's chunk is one
// 8-byte and one 4-byte load, each coalesced across the warp, and two broadcast ones; its sign
// word holds word w's 4 signs at bits w, w+8, w+16, w+24, so one shift brings them to the byte tops
// where PRMT's sign-replicate mode makes the byte mask (2 instructions a word against ~6 computing
// masks from the file's 7-bit fields; sign and offset in one LOP3 and one IMAD). Rows must be
// 8-aligned: cols a multiple of 1024. Fewer instructions in the loop than the file's fields regrouped
// (448 against 571 SASS instructions at 4 rows a CTA); the product then waits on the weights' loads.
__device__ __forceinline__ unsigned byte_sign_masks(unsigned v) {   // byte i: 0xFF if bit 8i+7 of v is set
#ifdef __CUDA_ARCH__
    unsigned m;
    asm("prmt.b32 %0, %1, 0, 0xBA98;" : "=r"(m) : "r"(v));
    return m;
#else   // the host emulator (tests/cuda_c_emulator.py)
    unsigned m = 0;
    for (int i = 0; i < 4; i++) m |= ((v >> (8 * i + 7)) & 1u) * (0xFFu << (8 * i));
    return m;
#endif
}
__device__ __forceinline__ unsigned and3(unsigned a, unsigned b, unsigned c) {   // one LOP3
#ifdef __CUDA_ARCH__
    unsigned t;
    asm("lop3.b32 %0, %1, %2, %3, 0x80;" : "=r"(t) : "r"(a), "r"(b), "r"(c));
    return t;
#else
    return a & b & c;
#endif
}
// The dp4a sums to floats. SC = 2 (the default):
// four I2F a chunk and one for the scale nibble. I2F runs 16 a clock an SM on sm_90 (FADD 128, IMAD
// 64), and a chunk's five come together at its end (the "math pipe throttle" stalls Nsight finds). SC = 3: the accumulators start at BIASED_SUM_ZERO, the int whose
// bits are the float 1.5 * 2^23, so that while |sum| < 2^22 (here <= 16 * 126 * 127) the bits read as
// 12582912 + sum and one FADD gives the float: no I2F; the scale's 2s + 1 the same way. SC = 4: hi and
// lo combined as integers first (254 sh + sl < 2^26, as Q4_K's dot8_hi_lo), two I2F a chunk.
#define BIASED_SUM_ZERO 0x4B400000
__device__ __forceinline__ float biased_sum_to_float(int acc) { return __int_as_float(acc) - 12582912.f; }
// A chunk's value from its 8 signed grid words (word(w): weights 4w..4w+3 as bytes 64 +- g), x's
// record (quantize_x<Iq3XxsBlock, 20>: hi and lo parts, then d_a, sum_a, d_b, sum_b), the block's d and the
// chunk's scale nibble: Iq3XxsGroup4Int8X's dot for SC != 2.
template <int SC, class Word>
__device__ __forceinline__ float iq3_chunk_dot_int8_x(Word word, const float4 (&xv)[8], unsigned short d, unsigned sc) {
    const uint4 f = as_uint4(xv[4]);
    const uint4 hx[2] = {as_uint4(xv[0]), as_uint4(xv[1])}, lx[2] = {as_uint4(xv[2]), as_uint4(xv[3])};
    int sh[2] = {SC == 3 ? BIASED_SUM_ZERO : 0, SC == 3 ? BIASED_SUM_ZERO : 0}, sl[2] = {sh[0], sh[1]};
    #pragma unroll
    for (int w = 0; w < 8; w++) {   // grid word w: weights 4w..4w+3, run w / 4
        const unsigned u = word(w);
        const int h = w >> 2, k = w & 3;
        const unsigned hv = k == 0 ? hx[h].x : k == 1 ? hx[h].y : k == 2 ? hx[h].z : hx[h].w;
        const unsigned lv = k == 0 ? lx[h].x : k == 1 ? lx[h].y : k == 2 ? lx[h].z : lx[h].w;
        sh[h] = __dp4a((int)u, (int)hv, sh[h]);
        sl[h] = __dp4a((int)u, (int)lv, sl[h]);
    }
    if constexpr (SC == 3 || SC == 4) {
        float ta, tb;   // 254 (w . hi) + (w . lo), runs a and b
        if constexpr (SC == 3) {
            ta = fmaf(254.f, biased_sum_to_float(sh[0]), biased_sum_to_float(sl[0]));
            tb = fmaf(254.f, biased_sum_to_float(sh[1]), biased_sum_to_float(sl[1]));
        } else {
            ta = (float)(254 * sh[0] + sl[0]);
            tb = (float)(254 * sh[1] + sl[1]);
        }
        const float ra = fmaf(__uint_as_float(f.x), ta, -64.f * __uint_as_float(f.y));
        const float rb = fmaf(__uint_as_float(f.z), tb, -64.f * __uint_as_float(f.w));
        if constexpr (SC == 3)   // 2 sc + 1 exactly, and (0.5 + sc) * 0.5 = (2 sc + 1) * 0.25
            return h2f(d) * (__int_as_float(0x4B000001u | (sc << 1)) - 8388608.f) * 0.25f * (ra + rb);
        return h2f(d) * (0.5f + (float)sc) * 0.5f * (ra + rb);
    }
    const float ra = fmaf(__uint_as_float(f.x), fmaf(254.f, (float)sh[0], (float)sl[0]), -64.f * __uint_as_float(f.y));
    const float rb = fmaf(__uint_as_float(f.z), fmaf(254.f, (float)sh[1], (float)sl[1]), -64.f * __uint_as_float(f.w));
    return h2f(d) * (0.5f + (float)sc) * 0.5f * (ra + rb);
}
template <int GC, int SC>
struct Iq3XxsGroup4Int8X : Iq3XxsBlockInt8X<GC, 2> {    // SC: how the sums become floats (iq3_chunk_dot_int8_x); the masks come from PRMT
    static constexpr int BE = 256, TS = 102, CPB = 8;
    struct Raw { unsigned q0, q1, s, sc; unsigned short d; };
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* g = row + (c >> 5) * 408;
        const int j = c & 31;
        const uint2 q = SH ? *(const uint2*)(g + 8 * j) : __ldg((const uint2*)(g + 8 * j));
        r.q0 = q.x;
        r.q1 = q.y;
        r.s = SH ? *(const unsigned*)(g + 256 + 4 * j) : __ldg((const unsigned*)(g + 256 + 4 * j));
        r.sc = SH ? *(const unsigned*)(g + 384 + 4 * (j >> 3)) : __ldg((const unsigned*)(g + 384 + 4 * (j >> 3)));
        r.d = SH ? *(const unsigned short*)(g + 400 + 2 * (j >> 3)) : __ldg((const unsigned short*)(g + 400 + 2 * (j >> 3)));
    }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float, float) {
        auto word = [&](int w) {   // grid word w, its signs in: bytes 64 +- g
            const unsigned qq = w < 4 ? r.q0 : r.q1;
            const unsigned u = Iq3XxsBlockInt8X<GC, 2>::grid((qq >> (8 * (w & 3))) & 255u);
            const unsigned m = byte_sign_masks(r.s << (7 - w));
            return u - 2u * and3(u, m, 0x3F3F3F3Fu);   // one LOP3 (nvcc otherwise splits this step into four)
        };
        if constexpr (SC != 2) return iq3_chunk_dot_int8_x<SC>(word, xv, r.d, (r.sc >> (4 * (c & 7))) & 15u);
        // SC = 2, the default, stays written out as measured: the same arithmetic through iq3_chunk_dot_int8_x
        // compiles to the same instructions in another order and other registers, which can move the time.
        const uint4 f = as_uint4(xv[4]);
        const uint4 hx[2] = {as_uint4(xv[0]), as_uint4(xv[1])}, lx[2] = {as_uint4(xv[2]), as_uint4(xv[3])};
        int sh[2] = {0, 0}, sl[2] = {0, 0};
        #pragma unroll
        for (int w = 0; w < 8; w++) {   // grid word w: weights 4w..4w+3, run w / 4
            const unsigned qq = w < 4 ? r.q0 : r.q1;
            unsigned u = Iq3XxsBlockInt8X<GC, 2>::grid((qq >> (8 * (w & 3))) & 255u);
            const unsigned m = byte_sign_masks(r.s << (7 - w));
            u -= 2u * and3(u, m, 0x3F3F3F3Fu);
            const int h = w >> 2, k = w & 3;
            const unsigned hv = k == 0 ? hx[h].x : k == 1 ? hx[h].y : k == 2 ? hx[h].z : hx[h].w;
            const unsigned lv = k == 0 ? lx[h].x : k == 1 ? lx[h].y : k == 2 ? lx[h].z : lx[h].w;
            sh[h] = __dp4a((int)u, (int)hv, sh[h]);
            sl[h] = __dp4a((int)u, (int)lv, sl[h]);
        }
        const float ra = fmaf(__uint_as_float(f.x), fmaf(254.f, (float)sh[0], (float)sl[0]), -64.f * __uint_as_float(f.y));
        const float rb = fmaf(__uint_as_float(f.z), fmaf(254.f, (float)sh[1], (float)sl[1]), -64.f * __uint_as_float(f.w));
        return h2f(r.d) * (0.5f + (float)((r.sc >> (4 * (c & 7))) & 15u)) * 0.5f * (ra + rb);
    }
};
