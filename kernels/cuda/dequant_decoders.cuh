// The dequantize kernels' common helpers (f2h, h2f, u16, hf, ld8_a2, byte_of, MUL/ADD/SUB), then the decoders.

typedef unsigned char uchar;
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float h2f(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned u16(const uchar* p, int i) { return p[i] | (p[i + 1] << 8); }
__device__ __forceinline__ float hf(const uchar* p, int i) { return h2f((unsigned short)u16(p, i)); }
// 8 bytes from shared memory at a 2-byte aligned address, as four 16-bit loads.
__device__ __forceinline__ uint2 ld8_a2(const uchar* p) {
    const unsigned short* h = (const unsigned short*)p;
    return make_uint2(h[0] | ((unsigned)h[1] << 16), h[2] | ((unsigned)h[3] << 16)); }
__device__ __forceinline__ unsigned byte_of(uint2 w, int i) { return ((i < 4 ? w.x : w.y) >> (8 * (i & 3))) & 0xFF; }
#define MUL __fmul_rn
#define ADD __fadd_rn
#define SUB __fsub_rn
// Each GGUF type's decoder for kernels/dequant_common.py's tile kernel (dequant_tile.cu): dec_<type>(b, j, v)
// writes values j..j+7 of the block at b (in shared memory) to v, in gguf-py's float operations.
// Every type's module includes them all (the unused ones compile to nothing).

__device__ __forceinline__ void nibbles(const uchar* qs, int j, int* q) {
    const int sh = (j >> 4) * 4;
    #pragma unroll
    for (int i = 0; i < 8; i++) q[i] = (qs[((j + i) & 15)] >> sh) & 15;
}

__device__ __forceinline__ void scale_min_k4(const uchar* s, int k, int* sc, int* m) {
    if (k < 4) { *sc = s[k] & 63; *m = s[k + 4] & 63; }
    else { *sc = (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4); *m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4); }
}

__device__ __forceinline__ void dec_f16(const uchar* b, int j, float* v) {
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = hf(b, 2 * i);
}

__device__ __forceinline__ void dec_bf16(const uchar* b, int j, float* v) {
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = __uint_as_float(u16(b, 2 * i) << 16);
}

__device__ __forceinline__ void dec_f32(const uchar* b, int j, float* v) {
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = ((const float*)b)[i];
}
__device__ __forceinline__ void dec_q4_0(const uchar* b, int j, float* v) {
    const float d = hf(b, 0); int q[8]; nibbles(b + 2, j, q);
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = MUL(d, (float)(q[i] - 8));
}
__device__ __forceinline__ void dec_q4_1(const uchar* b, int j, float* v) {
    const float d = hf(b, 0), m = hf(b, 2); int q[8]; nibbles(b + 4, j, q);
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = ADD(MUL(d, (float)q[i]), m);
}
__device__ __forceinline__ void dec_q5_0(const uchar* b, int j, float* v) {
    const float d = hf(b, 0); const unsigned qh = u16(b, 2) | (u16(b, 4) << 16);
    int q[8]; nibbles(b + 6, j, q);
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = MUL(d, (float)((q[i] | (int)(((qh >> (j + i)) & 1) << 4)) - 16));
}
__device__ __forceinline__ void dec_q5_1(const uchar* b, int j, float* v) {
    const float d = hf(b, 0), m = hf(b, 2); const unsigned qh = u16(b, 4) | (u16(b, 6) << 16);
    int q[8]; nibbles(b + 8, j, q);
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = ADD(MUL(d, (float)(q[i] | (((qh >> (j + i)) & 1) << 4))), m);
}

__device__ __forceinline__ void dec_q8_0(const uchar* b, int j, float* v) {
    const float d = hf(b, 0);
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = MUL((float)(signed char)b[2 + j + i], d);
}
__device__ __forceinline__ void dec_mxfp4(const uchar* b, int j, float* v) {
    const unsigned e = b[0];
    const float d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
    int q[8]; nibbles(b + 1, j, q);
    #pragma unroll
    for (int i = 0; i < 8; i++) {
        const int mag = (int)((0x0C08060403020100ull >> ((q[i] & 7) * 8)) & 0xFF);
        if (e >= 2 || mag == 0) {
            v[i] = MUL(d, (float)((q[i] & 8) ? -mag : mag));   // integer negate: no -0.0
        } else {
            // d is subnormal here and the GPU run flushed d*mag to zero although the reference
            // keeps it: build mag * 2^(e-128) from bits instead (exact).
            const unsigned n = (unsigned)mag << (21 + e);
            const unsigned bits = n < (1u << 23) ? n : __float_as_uint((float)n) - (149u << 23);
            v[i] = __uint_as_float(bits | ((q[i] & 8) ? 0x80000000u : 0u));
        }
    }
}

__device__ __forceinline__ void dec_q2_k(const uchar* b, int j, float* v) {
    const float d = hf(b, 80), dmin = hf(b, 82);
    const int sc = b[j >> 4];
    const float dl = MUL(d, (float)(sc & 15)), ml = MUL(dmin, (float)(sc >> 4));
    const uint2 q = ld8_a2(b + 16 + 32 * (j >> 7) + (j & 31));
    const int sh = ((j & 127) >> 5) * 2;
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = SUB(MUL(dl, (float)((byte_of(q, i) >> sh) & 3)), ml);
}

__device__ __forceinline__ void dec_q3_k(const uchar* b, int j, float* v) {
    const float d = hf(b, 108);
    const int k = j >> 4;
    const int lo = (b[96 + (k & 7)] >> (4 * (k >> 3))) & 15, hi = (b[104 + (k & 3)] >> (2 * (k >> 2))) & 3;
    const float dl = MUL(d, (float)((lo | (hi << 4)) - 32));
    // Blocks are 110 bytes: fields are only 2-byte aligned in shared memory.
    const uint2 q = ld8_a2(b + 32 + 32 * (j >> 7) + (j & 31)), hm = ld8_a2(b + (j & 31));
    const int sh = ((j & 127) >> 5) * 2, hb = j >> 5;
    #pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] = MUL(dl, (float)((int)((byte_of(q, i) >> sh) & 3) - (int)((((byte_of(hm, i) >> hb) & 1) ^ 1) << 2)));
}
__device__ __forceinline__ void dec_q4_k(const uchar* b, int j, float* v) {
    int sc, m; scale_min_k4(b + 4, j >> 5, &sc, &m);
    const float dd = MUL(hf(b, 0), (float)sc), dm = MUL(hf(b, 2), (float)m);
    // 16 + 32*c + l with l a multiple of 8 and the block 16-aligned in shared memory: 8-byte aligned.
    const uint2 w = *(const uint2*)(b + 16 + 32 * (j >> 6) + (j & 31));
    const int sh = ((j >> 5) & 1) * 4;
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = SUB(MUL(dd, (float)((byte_of(w, i) >> sh) & 15)), dm);
}
__device__ __forceinline__ void dec_q5_k(const uchar* b, int j, float* v) {
    int sc, m; scale_min_k4(b + 4, j >> 5, &sc, &m);
    const float dd = MUL(hf(b, 0), (float)sc), dm = MUL(hf(b, 2), (float)m);
    // 176-byte blocks stay 16-aligned in shared memory, so both fields are 8-byte aligned.
    const uint2 q = *(const uint2*)(b + 48 + 32 * (j >> 6) + (j & 31)), qh = *(const uint2*)(b + 16 + (j & 31));
    const int sh = ((j >> 5) & 1) * 4, hb = j >> 5;
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = SUB(MUL(dd, (float)(((byte_of(q, i) >> sh) & 15) | (((byte_of(qh, i) >> hb) & 1) << 4))), dm);
}

__device__ __forceinline__ void dec_q6_k(const uchar* b, int j, float* v) {
    const float dd = MUL(hf(b, 208), (float)(signed char)b[192 + (j >> 4)]);
    const int h = j >> 7, r = j & 127;
    // 210-byte blocks: fields are only 2-byte aligned in shared memory.
    const uint2 ql = ld8_a2(b + 64 * h + (r & 63)), qh = ld8_a2(b + 128 + 32 * h + (r & 31));
    const int lsh = (r >> 6) * 4, hsh = (r >> 5) * 2;
    #pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] = MUL(dd, (float)((int)(((byte_of(ql, i) >> lsh) & 15) | (((byte_of(qh, i) >> hsh) & 3) << 4)) - 32));
}
