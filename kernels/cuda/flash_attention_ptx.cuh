// The instructions kernels/cuda/flash_attention.cu is built on: mma.sync m16n8k16 (f16 in, f32
// accumulate), ldmatrix .x4 (and .trans), cp.async, the dynamic shared memory. On the GPU inline PTX
// (no <mma.h>: CuPy's pip wheels lack it); under tests/cuda_c_emulator.py the same fragments per the
// PTX ISA's tables, exchanged between a warp's host threads, and cp.async as a plain copy. FA_SMEM
// (the launcher's dynamic shared bytes) sizes the emulator's static stand-in.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
#define FA_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]

__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);             // lo in the low 16 bits: the lower column
    return *reinterpret_cast<unsigned*>(&h);
}

// c (16 x 8) += A (16 x 16) B (16 x 8): lane 4g + t holds A's rows g, g + 8 at k = 2t, 2t + 1 (a[0],
// a[1]) and 2t + 8, 2t + 9 (a[2], a[3]), B's column g at k = 2t.. (b0) and 2t + 8.. (b1), c's rows
// g, g + 8 at columns 2t, 2t + 1.
__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// a shared-memory address for PTX (inline PTX rather than __cvta_generic_to_shared: no header)
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// four 8x8 matrices; lane l points at row l % 8 of matrix l / 8; register i gets element
// (lane / 4, 2 (lane % 4) + j) of matrix i, or with .trans element (2 (lane % 4) + j, lane / 4)
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const __half* p) {
    unsigned a = smem_addr(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const __half* p) {
    unsigned a = smem_addr(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

// 16 bytes global -> shared without passing through registers; zero-filled when !valid
__device__ __forceinline__ void cp_async_16(__half* dst, const __half* src, bool valid) {
    unsigned d = smem_addr(dst);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

#else   // the host emulator: a block at a time, so a static array is the block's shared memory
#define FA_DYN_SMEM(name) alignas(16) static unsigned char name[FA_SMEM]

inline unsigned pack_half2(float lo, float hi) {
    _Float16 h[2] = {(_Float16)lo, (_Float16)hi};
    unsigned u;
    std::memcpy(&u, h, 4);
    return u;
}
inline float fa_half(unsigned reg, int j) {            // element j (0: the low 16 bits) of a .f16x2
    _Float16 h[2];
    std::memcpy(h, &reg, 4);
    return (float)h[j];
}

inline void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    unsigned* mine = tl_warp->mma[lane];
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b0;
    mine[5] = b1;
    tl_warp->bar->arrive_and_wait();
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float s = c[i];
        for (int k = 0; k < 16; k++)       // products of two halves are exact in fp32
            s += fa_half(tl_warp->mma[4 * (row & 7) + ((k & 7) >> 1)][(row >= 8) + 2 * (k >= 8)], k & 1) *
                 fa_half(tl_warp->mma[4 * col + ((k & 7) >> 1)][4 + (k >= 8)], k & 1);
        c[i] = s;
    }
    tl_warp->bar->arrive_and_wait();
}

inline void fa_ldmatrix(unsigned* r, const __half* p, bool trans) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    tl_warp->buf[lane] = (unsigned long long)p;
    tl_warp->bar->arrive_and_wait();
    for (int i = 0; i < 4; i++) {
        _Float16 h[2];
        for (int j = 0; j < 2; j++) {
            const __half* row = (const __half*)tl_warp->buf[8 * i + (trans ? 2 * t + j : g)];
            h[j] = row[trans ? g : 2 * t + j].v;
        }
        std::memcpy(&r[i], h, 4);
    }
    tl_warp->bar->arrive_and_wait();
}
inline void ldmatrix_x4(unsigned* r, const __half* p) { fa_ldmatrix(r, p, false); }
inline void ldmatrix_x4_trans(unsigned* r, const __half* p) { fa_ldmatrix(r, p, true); }

inline void cp_async_16(__half* dst, const __half* src, bool valid) {
    if (valid) std::memcpy(dst, src, 16);
    else std::memset(dst, 0, 16);
}
inline void cp_async_commit() {}
inline void cp_async_wait_1() {}
#endif
