
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
