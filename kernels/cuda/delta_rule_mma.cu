// The chunked gated delta rule (prefill) on the tensor cores, launched by kernels/delta_rule_mma.py:
// the WY form of flash-linear-attention's chunked kernels, in two launches.
//   delta_rule_mma_prep    every (chunk, value head) at once: G = cumsum(g),
//                          A = strictly_lower(beta_i K_i . K_j D_ij), T = (I + A)^-1 (fp32),
//                          W = T (beta exp(G) K), U = T (beta V), M = tril(Q_i . K_j D_ij)
//   delta_rule_mma_chunks  a block a (value head, DRM_DVT columns of S), its chunks in order:
//                          Vn = U - W S; O = exp(G) (Q S) + M Vn; S = exp(G_last) S + (K exp(G_last - G))^T Vn
// with D_ij = exp(G_i - G_j) (j <= i only), Q already scaled; the semantics are
// lite/backends/cpu_recurrent.py's delta_rule_chunked. The matrix products run on mma.sync
// m16n8k8 tf32 (fp32 range, an 11-bit significand) with fp32 accumulation; the state stays fp32
// in shared and global memory, the inverse T is fp32 CUDA-core math.
//
// Set by the wrapper: DRM_DK, DRM_DV (head dims, multiples of 16), DRM_DVT (value columns a
// chunks block, a multiple of 16), DRM_SPLIT (1: each product as three tf32 products of the inputs'
// high and low parts, about fp32's precision), DRM_SMEM (the larger kernel's dynamic shared bytes, for the
// host emulator's static stand-in).

#define DRM_BT 64                  // tokens a chunk (cpu_recurrent.DELTA_CHUNK)
#define DRM_KS (DRM_DK + 4)        // row strides padded so a fragment's rows fall in other banks
#define DRM_VS (DRM_DV + 8)
#define DRM_SS (DRM_DVT + 8)
#define DRM_TS (DRM_BT + 4)

#if defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
#define DRM_DYN_SMEM(name) extern __shared__ __align__(16) float name[]
__device__ __forceinline__ float drm_float(unsigned u) { return __uint_as_float(u); }
__device__ __forceinline__ unsigned drm_tf32(float x) {
    unsigned u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
    return u;
}
// c (16 x 8, fp32) += a (16 x 8, tf32) b (8 x 8, tf32): lane 4g + q holds a's rows g, g + 8 at
// k = q (a0, a1) and q + 4 (a2, a3), b's column g at k = q, q + 4, c's rows g, g + 8 at columns 2q, 2q + 1.
__device__ __forceinline__ void drm_mma(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                        unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#else   // the host emulator (tests/cuda_c_emulator.py): blocks one at a time, the warp's fragments exchanged
#define DRM_DYN_SMEM(name) alignas(16) static float name[DRM_SMEM / 4]
inline float drm_float(unsigned u) { float v; std::memcpy(&v, &u, 4); return v; }
inline unsigned drm_tf32(float x) {       // round to nearest, ties away, onto 10 stored fraction bits
    unsigned u;
    std::memcpy(&u, &x, 4);
    return (u + 0x1000u) & 0xFFFFE000u;
}
inline void drm_mma(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    unsigned* mine = tl_warp->mma[lane];
    mine[0] = a0; mine[1] = a1; mine[2] = a2; mine[3] = a3; mine[4] = b0; mine[5] = b1;
    tl_warp->bar->arrive_and_wait();
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
        float s = c[i];
        for (int k = 0; k < 8; k++)      // tf32 products are exact in fp32
            s += drm_float(tl_warp->mma[4 * (row & 7) + (k & 3)][(row >= 8) + 2 * (k >= 4)]) *
                 drm_float(tl_warp->mma[4 * col + (k & 3)][4 + (k >= 4)]);
        c[i] = s;
    }
    tl_warp->bar->arrive_and_wait();
}
#endif

// An operand of a product read from shared memory: element (r, c) at p[r * rs + c * cs].
struct DrmOperand { const float* p; int rs, cs; };

// x as tf32, and with DRM_SPLIT what it leaves (x = hi + lo to about 22 bits: "3xTF32").
struct DrmTf32 { unsigned hi, lo; };
__device__ __forceinline__ DrmTf32 drm_split(float x) {
    const unsigned hi = drm_tf32(x);
#if DRM_SPLIT
    return {hi, drm_tf32(x - drm_float(hi))};
#else
    return {hi, 0u};
#endif
}

// acc (a 16 x 16 strip at rows m0, columns n0) += A (m0.., k0..k1) B (k0..k1, n0..); k0, k1
// multiples of 8. DRM_SPLIT: a_lo b_hi + a_hi b_lo + a_hi b_hi, the small terms first.
__device__ __forceinline__ void drm_strip(float (&acc)[2][4], int m0, int n0, int k0, int k1,
                                          DrmOperand A, DrmOperand B) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    for (int k = k0; k < k1; k += 8) {
        const float* a = A.p + (m0 + g) * A.rs + (k + q) * A.cs;
        const DrmTf32 a0 = drm_split(a[0]), a1 = drm_split(a[8 * A.rs]);
        const DrmTf32 a2 = drm_split(a[4 * A.cs]), a3 = drm_split(a[8 * A.rs + 4 * A.cs]);
        #pragma unroll
        for (int j = 0; j < 2; ++j) {
            const float* b = B.p + (k + q) * B.rs + (n0 + 8 * j + g) * B.cs;
            const DrmTf32 b0 = drm_split(b[0]), b1 = drm_split(b[4 * B.rs]);
#if DRM_SPLIT
            drm_mma(acc[j], a0.lo, a1.lo, a2.lo, a3.lo, b0.hi, b1.hi);
            drm_mma(acc[j], a0.hi, a1.hi, a2.hi, a3.hi, b0.lo, b1.lo);
#endif
            drm_mma(acc[j], a0.hi, a1.hi, a2.hi, a3.hi, b0.hi, b1.hi);
        }
    }
}

// The (M x N) product A1 B1 (inner dim K1) [+ A2 B2 (inner dim K2)] in 16 x 16 strips, the warps
// taking strips in turn; epi(row, col, value) gets each element once, from the lane that holds it.
// lower: the result is lower triangular (strips wholly above the diagonal skip their products and
// give zeros).
template <class Epi>
__device__ __forceinline__ void drm_product(int M, int N, bool lower, int K1, DrmOperand A1, DrmOperand B1,
                                            int K2, DrmOperand A2, DrmOperand B2, Epi epi) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3, ns = N / 16;
    for (int s = threadIdx.x >> 5; s < (M / 16) * ns; s += blockDim.x >> 5) {
        const int m0 = s / ns * 16, n0 = s % ns * 16;
        float acc[2][4] = {};
        if (!lower || n0 <= m0) {
            drm_strip(acc, m0, n0, 0, K1, A1, B1);
            if (K2) drm_strip(acc, m0, n0, 0, K2, A2, B2);
        }
        #pragma unroll
        for (int j = 0; j < 2; ++j)
            #pragma unroll
            for (int i = 0; i < 4; ++i) epi(m0 + g + 8 * (i >> 1), n0 + 8 * j + 2 * q + (i & 1), acc[j][i]);
    }
}

// T = (I + A)^-1 of the strictly lower A (BT x BT, stride TS) into sT (zeroed before), fp32: the
// four 16 x 16 diagonal blocks by forward substitution (a thread a column), then block row by
// block row T_ij = -T_ii sum_k A_ik T_kj through the scratch P (16 x BT).
__device__ __forceinline__ void drm_invert(const float* sA, float* sT, float* sP) {
    const int tid = threadIdx.x;
    if (tid < DRM_BT) {
        const int b = tid / 16 * 16, c = b + tid % 16;
        sT[c * DRM_TS + c] = 1.f;
        for (int i = c + 1; i < b + 16; ++i) {
            float acc = 0.f;
            for (int j = c; j < i; ++j) acc += sA[i * DRM_TS + j] * sT[j * DRM_TS + c];
            sT[i * DRM_TS + c] = -acc;
        }
    }
    __syncthreads();
    for (int bi = 16; bi < DRM_BT; bi += 16) {
        for (int e = tid; e < 16 * bi; e += blockDim.x) {           // P = A (rows of block bi) T (cols < bi)
            const int r = e / bi, c = e % bi;
            float acc = 0.f;
            for (int k = c; k < bi; ++k) acc += sA[(bi + r) * DRM_TS + k] * sT[k * DRM_TS + c];
            sP[r * DRM_BT + c] = acc;
        }
        __syncthreads();
        for (int e = tid; e < 16 * bi; e += blockDim.x) {           // T_i,<i = -T_ii P
            const int r = e / bi, c = e % bi;
            float acc = 0.f;
            for (int k = 0; k <= r; ++k) acc += sT[(bi + r) * DRM_TS + bi + k] * sP[k * DRM_BT + c];
            sT[(bi + r) * DRM_TS + c] = -acc;
        }
        __syncthreads();
    }
}

// A block a (chunk, value head h). Writes W (T, Hv, dk), U (T, Hv, dv), G (T, Hv) for the chunk's
// rows and M (chunks, Hv, BT, BT); the rows past T are zeros (g = beta = k = 0), which change nothing.
extern "C" __global__ void delta_rule_mma_prep(const float* q, const float* k, const float* v,
                                               const float* g, const float* beta, float* W, float* U,
                                               float* Gout, float* M, int T, int Hk, int Hv, float scale) {
    DRM_DYN_SMEM(smem);
    float* sK = smem;                               // (BT, KS) K, then beta exp(G) K
    float* sQ = sK + DRM_BT * DRM_KS;               // (BT, KS) scaled Q
    float* sV = sQ + DRM_BT * DRM_KS;               // (BT, VS) beta V
    float* sA = sV + DRM_BT * DRM_VS;               // (BT, TS) A
    float* sT = sA + DRM_BT * DRM_TS;               // (BT, TS) T
    float* sP = sT + DRM_BT * DRM_TS;               // (16, BT) the inverse's scratch
    float* sG = sP + 16 * DRM_BT;                   // (BT) G
    float* sB = sG + DRM_BT;                        // (BT) beta
    const int chunk = blockIdx.x, h = blockIdx.y, hk = h / (Hv / Hk), tid = threadIdx.x;
    const int t0 = chunk * DRM_BT, n = min(DRM_BT, T - t0);
    for (int e = tid; e < DRM_BT * DRM_DK; e += blockDim.x) {
        const int t = e / DRM_DK, d = e % DRM_DK;
        const long long at = ((long long)(t0 + t) * Hk + hk) * DRM_DK + d;
        sK[t * DRM_KS + d] = t < n ? k[at] : 0.f;
        sQ[t * DRM_KS + d] = t < n ? q[at] * scale : 0.f;
    }
    for (int e = tid; e < DRM_BT * DRM_DV; e += blockDim.x) {
        const int t = e / DRM_DV, c = e % DRM_DV;
        sV[t * DRM_VS + c] = t < n ? v[((long long)(t0 + t) * Hv + h) * DRM_DV + c] : 0.f;
    }
    for (int e = tid; e < DRM_BT * DRM_TS; e += blockDim.x) sT[e] = 0.f;
    if (tid < DRM_BT) {
        sG[tid] = tid < n ? g[(long long)(t0 + tid) * Hv + h] : 0.f;
        sB[tid] = tid < n ? beta[(long long)(t0 + tid) * Hv + h] : 0.f;
    }
    __syncthreads();
    if (tid == 0)                                   // in order, as NumPy's cumsum adds
        for (int t = 1; t < DRM_BT; ++t) sG[t] += sG[t - 1];
    __syncthreads();
    if (tid < n) Gout[(long long)(t0 + tid) * Hv + h] = sG[tid];
    const DrmOperand K = {sK, DRM_KS, 1}, KT = {sK, 1, DRM_KS}, Q = {sQ, DRM_KS, 1}, none = {sK, 0, 0};
    // the mask before the exponential: above the diagonal G_i - G_j > 0 and can overflow
    drm_product(DRM_BT, DRM_BT, true, DRM_DK, K, KT, 0, none, none, [&](int i, int j, float x) {
        sA[i * DRM_TS + j] = j < i ? sB[i] * x * expf(sG[i] - sG[j]) : 0.f;
    });
    float* Mc = M + ((long long)chunk * Hv + h) * DRM_BT * DRM_BT;
    drm_product(DRM_BT, DRM_BT, true, DRM_DK, Q, KT, 0, none, none, [&](int i, int j, float x) {
        Mc[i * DRM_BT + j] = j <= i ? x * expf(sG[i] - sG[j]) : 0.f;
    });
    __syncthreads();                                // K read by both products before it is scaled
    for (int e = tid; e < DRM_BT * DRM_DK; e += blockDim.x) {
        const int t = e / DRM_DK, d = e % DRM_DK;
        sK[t * DRM_KS + d] *= sB[t] * expf(sG[t]);
    }
    for (int e = tid; e < DRM_BT * DRM_DV; e += blockDim.x) sV[e / DRM_DV * DRM_VS + e % DRM_DV] *= sB[e / DRM_DV];
    drm_invert(sA, sT, sP);                         // its barriers also order the scaling above
    const DrmOperand Tm = {sT, DRM_TS, 1}, V = {sV, DRM_VS, 1};
    drm_product(DRM_BT, DRM_DK, false, DRM_BT, Tm, K, 0, none, none, [&](int t, int d, float x) {
        if (t < n) W[((long long)(t0 + t) * Hv + h) * DRM_DK + d] = x;
    });
    drm_product(DRM_BT, DRM_DV, false, DRM_BT, Tm, V, 0, none, none, [&](int t, int c, float x) {
        if (t < n) U[((long long)(t0 + t) * Hv + h) * DRM_DV + c] = x;
    });
}

// A block a (value head h, DRM_DVT columns of S (Hv, dk, dv), updated in place), over the chunks
// in order, from the prep's W, U, G and M.
extern "C" __global__ void delta_rule_mma_chunks(const float* q, const float* k, const float* W,
                                                 const float* U, const float* G, const float* M,
                                                 float* S, float* out, int T, int Hk, int Hv, float scale) {
    DRM_DYN_SMEM(smem);
    float* sS = smem;                               // (dk, SS) the state's columns
    float* sQ = sS + DRM_DK * DRM_SS;               // (BT, KS) scale exp(G) Q
    float* sK = sQ + DRM_BT * DRM_KS;               // (BT, KS) exp(G_last - G) K
    float* sW = sK + DRM_BT * DRM_KS;               // (BT, KS) W
    float* sU = sW + DRM_BT * DRM_KS;               // (BT, SS) U, then Vn
    float* sM = sU + DRM_BT * DRM_SS;               // (BT, TS) M
    float* sG = sM + DRM_BT * DRM_TS;               // (BT) G
    const int h = blockIdx.x, hk = h / (Hv / Hk), c0 = blockIdx.y * DRM_DVT, tid = threadIdx.x;
    const int cols = min(DRM_DVT, DRM_DV - c0);
    float* Sh = S + (long long)h * DRM_DK * DRM_DV;
    for (int e = tid; e < DRM_DK * DRM_DVT; e += blockDim.x) {
        const int d = e / DRM_DVT, c = e % DRM_DVT;
        sS[d * DRM_SS + c] = c < cols ? Sh[(long long)d * DRM_DV + c0 + c] : 0.f;
    }
    const DrmOperand Wm = {sW, DRM_KS, 1}, Sm = {sS, DRM_SS, 1}, Qm = {sQ, DRM_KS, 1}, Mm = {sM, DRM_TS, 1};
    const DrmOperand Vn = {sU, DRM_SS, 1}, KdT = {sK, 1, DRM_KS}, none = {sS, 0, 0};
    for (int t0 = 0, chunk = 0; t0 < T; t0 += DRM_BT, ++chunk) {
        const int n = min(DRM_BT, T - t0);
        if (tid < DRM_BT) sG[tid] = tid < n ? G[(long long)(t0 + tid) * Hv + h] : 0.f;
        __syncthreads();
        const float G_last = sG[n - 1];
        for (int e = tid; e < DRM_BT * DRM_DK; e += blockDim.x) {
            const int t = e / DRM_DK, d = e % DRM_DK;
            const long long at = ((long long)(t0 + t) * Hk + hk) * DRM_DK + d;
            const bool live = t < n;
            sQ[t * DRM_KS + d] = live ? q[at] * scale * expf(sG[t]) : 0.f;
            sK[t * DRM_KS + d] = live ? k[at] * expf(G_last - sG[t]) : 0.f;
            sW[t * DRM_KS + d] = live ? W[((long long)(t0 + t) * Hv + h) * DRM_DK + d] : 0.f;
        }
        for (int e = tid; e < DRM_BT * DRM_DVT; e += blockDim.x) {
            const int t = e / DRM_DVT, c = e % DRM_DVT;
            sU[t * DRM_SS + c] = (t < n && c < cols) ? U[((long long)(t0 + t) * Hv + h) * DRM_DV + c0 + c] : 0.f;
        }
        const float* Mc = M + ((long long)chunk * Hv + h) * DRM_BT * DRM_BT;
        for (int e = tid; e < DRM_BT * DRM_BT; e += blockDim.x) sM[e / DRM_BT * DRM_TS + e % DRM_BT] = Mc[e];
        __syncthreads();
        drm_product(DRM_BT, DRM_DVT, false, DRM_DK, Wm, Sm, 0, none, none, [&](int t, int c, float x) {
            sU[t * DRM_SS + c] -= x;                // Vn = U - W S: each element from one lane
        });
        __syncthreads();
        drm_product(DRM_BT, DRM_DVT, false, DRM_DK, Qm, Sm, DRM_BT, Mm, Vn, [&](int t, int c, float x) {
            if (t < n && c < cols) out[((long long)(t0 + t) * Hv + h) * DRM_DV + c0 + c] = x;
        });
        __syncthreads();                            // O has read S
        const float eL = expf(G_last);
        drm_product(DRM_DK, DRM_DVT, false, DRM_BT, KdT, Vn, 0, none, none, [&](int d, int c, float x) {
            sS[d * DRM_SS + c] = eL * sS[d * DRM_SS + c] + x;
        });
        __syncthreads();                            // before the next chunk's rows replace these
    }
    for (int e = tid; e < DRM_DK * DRM_DVT; e += blockDim.x) {
        const int d = e / DRM_DVT, c = e % DRM_DVT;
        if (c < cols) Sh[(long long)d * DRM_DV + c0 + c] = sS[d * DRM_SS + c];
    }
}
