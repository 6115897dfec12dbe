// Attention of one query token over keys 0..*pos (flash-decoding), launched by
// kernels/decode_attention.py: f16 or int8 cache, GQA head groups of DA_GB, the position read from
// the device (a captured graph replays any position), a grid fixed by S_max, the keys split over
// blocks and the splits merged by the last block of a column.
// - every warp is its own flash-decoding stream: it owns stages of 8 keys (stage i of the split goes
//   to warp i % NW) and copies each stage's K rows, V rows (and int8 row scales) into a private ring
//   of shared memory with cp.async, NSTG stages ahead, so K and V of several stages are in flight at
//   once and no register holds a load; no block barrier until the split is done;
// - scores: 8 dims a lane (one 16-byte row piece), the partial dots of 8 keys x 4 heads are reduced
//   over the lanes of a row by a reduce-scatter (15 shuffles at D=128, not 64), after which every
//   lane holds exactly one (key, head) score, so the online softmax needs 3 shuffles a stage;
// - P.V: each lane owns 4 value dims of all 8 rows and all 4 heads (weights by one broadcast read);
// - the NW warps meet once in shared memory, the split's partial goes out, and the last block of a
//   column merges the splits with all its threads and 8 loads in flight each.
// Compiled once per shape (head dims as constants). The host emulation (tests/cuda_c_emulator.py)
// runs cp.async as plain copies.
#include "last_block_to_count.cuh"
#include "pdl.cuh"

// set by the wrapper: DA_D, DA_DV (head dims), DA_NW (warps a block), DA_STG_F16, DA_STG_I8
// (stages a warp's ring holds), DA_SMEM (dynamic shared bytes), DA_MIN_BLOCKS (blocks an SM)
#define DA_GB 4                  // query heads a block column serves
#define DA_KW 8                  // keys a warp stage: DA_GB * DA_KW = 32 scores, one a lane
#define DA_THREADS (DA_NW * 32)
#define DA_MAX_SPLITS 128
#define DA_LPK (DA_D <= 32 ? 4 : DA_D <= 64 ? 8 : DA_D <= 128 ? 16 : 32)   // lanes a K row
#define DA_RPW (32 / DA_LPK)     // K rows a warp pass
#define DA_NP (DA_KW / DA_RPW)   // passes over a stage's K rows
#define DA_VC ((DA_DV + 127) / 128)   // 4-dim V pieces a lane
#define DA_NEG_INF (-__int_as_float(0x7f800000))

#if defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
#define DA_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#else   // host emulation (tests/cuda_c_emulator.py): blocks run one at a time
#define DA_DYN_SMEM(name) alignas(16) static unsigned char name[DA_SMEM]
#endif

__device__ __forceinline__ unsigned da_saddr(const void* p) {
    unsigned a;
#ifdef __CUDA_ARCH__
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
#else
    a = 0;
#endif
    return a;
}
// global -> shared without registers, zero-filled when !valid (masked rows must be 0, not stale
// bytes: a stale NaN times a zero weight would poison the sum)
__device__ __forceinline__ void da_cp16(void* dst, const void* src, bool valid) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(da_saddr(dst)), "l"(src), "r"(valid ? 16 : 0) : "memory");
#else
    uint4 z = {0u, 0u, 0u, 0u};
    *reinterpret_cast<uint4*>(dst) = valid ? *reinterpret_cast<const uint4*>(src) : z;
#endif
}
__device__ __forceinline__ void da_cp4(void* dst, const void* src, bool valid) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(da_saddr(dst)), "l"(src), "r"(valid ? 4 : 0) : "memory");
#else
    *reinterpret_cast<float*>(dst) = valid ? *reinterpret_cast<const float*>(src) : 0.f;
#endif
}
__device__ __forceinline__ void da_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void da_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
#endif
}
// 8 (K) or 4 (V) consecutive cache values from shared memory, widened to floats
__device__ __forceinline__ void da_ld8(const __half* p, float* f) {
    uint4 u = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&u);
    for (int i = 0; i < 4; ++i) { float2 v = __half22float2(h[i]); f[2 * i] = v.x; f[2 * i + 1] = v.y; }
}
__device__ __forceinline__ void da_ld8(const signed char* p, float* f) {
    uint2 u = *reinterpret_cast<const uint2*>(p);
    const signed char* c = reinterpret_cast<const signed char*>(&u);
    for (int i = 0; i < 8; ++i) f[i] = (float)c[i];
}
__device__ __forceinline__ void da_ld4(const __half* p, float* f) {
    uint2 u = *reinterpret_cast<const uint2*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&u);
    for (int i = 0; i < 2; ++i) { float2 v = __half22float2(h[i]); f[2 * i] = v.x; f[2 * i + 1] = v.y; }
}
__device__ __forceinline__ void da_ld4(const signed char* p, float* f) {
    unsigned u = *reinterpret_cast<const unsigned*>(p);
    const signed char* c = reinterpret_cast<const signed char*>(&u);
    for (int i = 0; i < 4; ++i) f[i] = (float)c[i];
}

// one level of the reduce-scatter per template step (constant indices: part stays in registers)
template <int N> __device__ __forceinline__ void da_reduce_scatter(float* part, int li) {
    if constexpr (N > 1) {
        const bool up = li & (N / 2);
        #pragma unroll
        for (int j = 0; j < N / 2; ++j) {
            const float give = up ? part[j] : part[j + N / 2];
            const float keep = up ? part[j + N / 2] : part[j];
            part[j] = keep + __shfl_xor_sync(0xffffffff, give, N / 2);
        }
        da_reduce_scatter<N / 2>(part, li);
    }
}

// one warp stage: K rows t0..t0+7 of the head (rows >= hi zero-filled), then V rows, then (int8)
// the 8 K scales and 8 V scales; all contiguous in global memory as in shared memory
template <typename T> __device__ __forceinline__ void da_issue(unsigned char* buf, const T* Kh,
        const T* Vh, const float* ksh, const float* vsh, long long t0, long long hi, int lane) {
    constexpr int KB = DA_KW * DA_D * (int)sizeof(T), VB = DA_KW * DA_DV * (int)sizeof(T);
    constexpr int KR = DA_D * (int)sizeof(T) / 16, VR = DA_DV * (int)sizeof(T) / 16;
    const unsigned char* ksrc = reinterpret_cast<const unsigned char*>(Kh + t0 * DA_D);
    const unsigned char* vsrc = reinterpret_cast<const unsigned char*>(Vh + t0 * DA_DV);
    #pragma unroll
    for (int k = 0; k < (KB / 16 + 31) / 32; ++k) {       // a fixed count: fully unrolled
        const int c = lane + 32 * k;
        if ((KB / 16) % 32 != 0 && c >= KB / 16) break;
        const bool ok = t0 + c / KR < hi;
        da_cp16(buf + 16 * c, ok ? ksrc + 16 * c : ksrc, ok);
    }
    #pragma unroll
    for (int k = 0; k < (VB / 16 + 31) / 32; ++k) {
        const int c = lane + 32 * k;
        if ((VB / 16) % 32 != 0 && c >= VB / 16) break;
        const bool ok = t0 + c / VR < hi;
        da_cp16(buf + KB + 16 * c, ok ? vsrc + 16 * c : vsrc, ok);
    }
    if (sizeof(T) == 1 && lane < 2 * DA_KW) {
        const float* s = (lane < DA_KW ? ksh : vsh) + t0;
        int r = lane % DA_KW;
        da_cp4(buf + KB + VB + 4 * lane, t0 + r < hi ? s + r : s, t0 + r < hi);
    }
}

template <typename T, int NSTG> __device__ void decode_attention(
        const float* q, const T* K, const T* V, const float* ks, const float* vs, float* pm,
        float* pl, float* pacc, int* counters, float* out, const long long* pos_ptr, int H,
        int Hkv, int S_max, float scale, int window, int min_chunk) {
    constexpr int KB = DA_KW * DA_D * (int)sizeof(T), VB = DA_KW * DA_DV * (int)sizeof(T);
    constexpr int SB = KB + VB + (sizeof(T) == 1 ? 8 * DA_KW : 0);   // bytes a stage
    DA_DYN_SMEM(smem);
    __shared__ float4 pw[DA_NW][(DA_KW * DA_GB + DA_GB) / 4];   // a warp's weights, alphas
    __shared__ float wm[DA_NW][DA_GB], wl[DA_NW][DA_GB], inv_l[DA_GB];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, NS = gridDim.y;
    const int G = H / Hkv, n_groups = (G + DA_GB - 1) / DA_GB;
    const int hk = blockIdx.x / n_groups, gb = blockIdx.x % n_groups;
    const int h0 = hk * G + gb * DA_GB, ng = min(DA_GB, G - gb * DA_GB);
    const int li = lane % DA_LPK, sub = lane / DA_LPK, d0 = li * 8;

    // q (pre-scaled) does not depend on the position: its loads go out with the position's
    float qr[DA_GB][8];
    #pragma unroll
    for (int g = 0; g < DA_GB; ++g) {
        bool ok = g < ng && d0 < DA_D;
        const float* src = q + (long long)(h0 + (ok ? g : 0)) * DA_D + (ok ? d0 : 0);
        float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
        float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        #pragma unroll
        for (int i = 0; i < 8; ++i) qr[g][i] = ok ? v[i] * scale : 0.f;
    }
    const long long pos = *pos_ptr;
    const long long j0 = window > 0 ? max(0LL, pos - window + 1) : 0;
    const long long nk = pos + 1 - j0;
    const int step = DA_KW * DA_NW;              // a chunk is a whole number of block passes
    long long chunk = (nk + NS - 1) / NS;
    chunk = max((long long)min_chunk, (chunk + step - 1) / step * step);
    const int active = (int)((nk + chunk - 1) / chunk);
    const int split = blockIdx.y;
    if (split >= active) return;
    const long long lo = j0 + split * chunk, hi = min(pos + 1, lo + chunk);
    const long long slot = (long long)blockIdx.x * NS + split;
    const T* Kh = K + (long long)hk * S_max * DA_D;
    const T* Vh = V + (long long)hk * S_max * DA_DV;
    const float* ksh = ks ? ks + (long long)hk * S_max : nullptr;
    const float* vsh = vs ? vs + (long long)hk * S_max : nullptr;

    // this warp's stages: w, w + NW, ... of the split's ceil((hi - lo) / 8)
    const int n_stages = (int)((hi - lo + DA_KW - 1) / DA_KW);
    const int nst = warp < n_stages ? (n_stages - warp + DA_NW - 1) / DA_NW : 0;
    unsigned char* ring = smem + warp * NSTG * SB;
    #pragma unroll
    for (int i = 0; i < NSTG; ++i) {
        if (i < nst) da_issue<T>(ring + i * SB, Kh, Vh, ksh, vsh, lo + (long long)(warp + i * DA_NW) * DA_KW, hi, lane);
        da_commit();                             // empty groups too: wait_group counts stay right
    }
    float acc[DA_GB][DA_VC][4];
    #pragma unroll
    for (int g = 0; g < DA_GB; ++g)
        for (int c = 0; c < DA_VC; ++c)
            for (int i = 0; i < 4; ++i) acc[g][c][i] = 0.f;
    float m_run = DA_NEG_INF, l_run = 0.f;      // of head lane % 4 (lanes of a head agree on m)
    const int key = (li >> 2) * DA_RPW + sub;    // the (key, head) score a lane ends up with
    float* wts = reinterpret_cast<float*>(pw[warp]);

    for (int i = 0; i < nst; ++i) {
        da_wait<NSTG - 1>();                     // this lane's copies of stage i have landed
        __syncwarp();                            // and the other lanes' are visible
        const unsigned char* buf = ring + (i % NSTG) * SB;
        const long long t0 = lo + (long long)(warp + i * DA_NW) * DA_KW;
        const T* Ks = reinterpret_cast<const T*>(buf);
        const T* Vs = reinterpret_cast<const T*>(buf + KB);
        float part[DA_NP * DA_GB];
        #pragma unroll
        for (int p = 0; p < DA_NP; ++p) {
            float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            if (d0 < DA_D) da_ld8(Ks + (p * DA_RPW + sub) * DA_D + d0, f);
            #pragma unroll
            for (int g = 0; g < DA_GB; ++g) {
                float a = 0.f;
                #pragma unroll
                for (int j = 0; j < 8; ++j) a = fmaf(qr[g][j], f[j], a);
                part[p * DA_GB + g] = a;
            }
        }
        // reduce-scatter over the DA_LPK lanes of a row: each level a lane keeps half of its
        // values (the upper half if its lane bit is set) and adds the partner's copy of that half;
        // after log2(DA_LPK) levels lane li holds value li = pass li/4, head li%4, fully summed
        da_reduce_scatter<DA_LPK>(part, li);
        float s = part[0];
        const float* scl = reinterpret_cast<const float*>(buf + KB + VB);
        if (sizeof(T) == 1) s *= scl[key];
        if (t0 + key >= hi) s = DA_NEG_INF;
        // online softmax of head lane % 4 over the 8 lanes that hold its 8 keys (lane bits 2..4)
        float mx = fmaxf(s, __shfl_xor_sync(0xffffffff, s, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 16));
        const float m_new = fmaxf(m_run, mx);    // finite: key 0 of a stage is always < hi
        const float p = __expf(s - m_new), alpha = __expf(m_run - m_new);
        l_run = l_run * alpha + p;
        m_run = m_new;
        wts[key * DA_GB + (lane & 3)] = sizeof(T) == 1 ? p * scl[DA_KW + key] : p;
        if (lane < DA_GB) wts[DA_KW * DA_GB + lane] = alpha;
        __syncwarp();
        const float4 al = *reinterpret_cast<const float4*>(wts + DA_KW * DA_GB);
        #pragma unroll
        for (int c = 0; c < DA_VC; ++c)
            for (int j = 0; j < 4; ++j) {
                acc[0][c][j] *= al.x; acc[1][c][j] *= al.y; acc[2][c][j] *= al.z; acc[3][c][j] *= al.w;
            }
        #pragma unroll
        for (int r = 0; r < DA_KW; ++r) {
            const float4 w = *reinterpret_cast<const float4*>(wts + r * DA_GB);
            #pragma unroll
            for (int c = 0; c < DA_VC; ++c) {
                const int d = 4 * (lane + 32 * c);
                if (d >= DA_DV) continue;
                float v[4];
                da_ld4(Vs + r * DA_DV + d, v);
                #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    acc[0][c][j] = fmaf(w.x, v[j], acc[0][c][j]);
                    acc[1][c][j] = fmaf(w.y, v[j], acc[1][c][j]);
                    acc[2][c][j] = fmaf(w.z, v[j], acc[2][c][j]);
                    acc[3][c][j] = fmaf(w.w, v[j], acc[3][c][j]);
                }
            }
        }
        __syncwarp();                            // all lanes are done with this ring slot
        if (i + NSTG < nst)
            da_issue<T>(ring + (i % NSTG) * SB, Kh, Vh, ksh, vsh, t0 + (long long)NSTG * DA_NW * DA_KW, hi, lane);
        da_commit();
    }
    da_wait<0>();
    l_run += __shfl_xor_sync(0xffffffff, l_run, 4);
    l_run += __shfl_xor_sync(0xffffffff, l_run, 8);
    l_run += __shfl_xor_sync(0xffffffff, l_run, 16);
    if (lane < DA_GB) { wm[warp][lane] = m_run; wl[warp][lane] = l_run; }
    __syncthreads();                             // every ring is drained: reuse it for the warps' sums
    float* red = reinterpret_cast<float*>(smem); // [NW][GB][DV]
    #pragma unroll
    for (int g = 0; g < DA_GB; ++g)
        for (int c = 0; c < DA_VC; ++c) {
            const int d = 4 * (lane + 32 * c);
            if (d < DA_DV)
                *reinterpret_cast<float4*>(red + (warp * DA_GB + g) * DA_DV + d) =
                    float4{acc[g][c][0], acc[g][c][1], acc[g][c][2], acc[g][c][3]};
        }
    __syncthreads();
    for (int idx = tid; idx < ng * DA_DV; idx += DA_THREADS) {
        const int g = idx / DA_DV, d = idx % DA_DV;
        float M = DA_NEG_INF;
        for (int w = 0; w < DA_NW; ++w) M = fmaxf(M, wm[w][g]);
        float a = 0.f, L = 0.f;
        for (int w = 0; w < DA_NW; ++w) {        // warps without keys: m = -inf, weight 0
            const float e = __expf(wm[w][g] - M);
            a = fmaf(e, red[(w * DA_GB + g) * DA_DV + d], a);
            L = fmaf(e, wl[w][g], L);
        }
        if (active == 1) {
            out[(long long)(h0 + g) * DA_DV + d] = a / L;
        } else {
            pacc[(slot * DA_GB + g) * DA_DV + d] = a;
            if (d == 0) { pm[slot * DA_GB + g] = M; pl[slot * DA_GB + g] = L; }
        }
    }
    if (active == 1) return;

    if (!dec_last_of_column(counters, active)) return;   // the last block merges the splits
    const long long col = (long long)blockIdx.x * NS;
    float* wsplit = red;                         // [GB][MAX_SPLITS]: red is free again
    for (int g = warp; g < ng; g += DA_NW) {
        float split_max[DA_MAX_SPLITS / 32], M = DA_NEG_INF;
        #pragma unroll
        for (int u = 0; u < DA_MAX_SPLITS / 32; ++u) {
            const int s = lane + 32 * u;
            split_max[u] = s < active ? __ldcg(pm + (col + s) * DA_GB + g) : DA_NEG_INF;
            M = fmaxf(M, split_max[u]);
        }
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffff, M, o));
        float L = 0.f;
        #pragma unroll
        for (int u = 0; u < DA_MAX_SPLITS / 32; ++u) {
            const int s = lane + 32 * u;
            if (s < active) {
                const float e = __expf(split_max[u] - M);
                wsplit[g * DA_MAX_SPLITS + s] = e;
                L = fmaf(e, __ldcg(pl + (col + s) * DA_GB + g), L);
            }
        }
        for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffff, L, o);
        if (lane == 0) inv_l[g] = 1.f / L;
    }
    __syncthreads();
    // float4 units of the column's outputs; NG thread groups share the splits of a unit, 8 loads
    // in flight a thread, then meet in shared memory (the merge is the launch's tail)
    constexpr int UA = DA_GB * DA_DV / 4;
    constexpr int NG = DA_THREADS >= UA ? DA_THREADS / UA : 1;
    float4* gsum = reinterpret_cast<float4*>(wsplit + DA_GB * DA_MAX_SPLITS);   // [NG][UA]
    for (int u0 = tid; u0 < UA * NG; u0 += DA_THREADS) {
        const int u = u0 % UA, j = u0 / UA, g = 4 * u / DA_DV, d = 4 * u % DA_DV;
        if (g >= ng) continue;
        const float* src = pacc + (col * DA_GB + g) * DA_DV + d;
        float4 a = {0.f, 0.f, 0.f, 0.f};
        for (int s0 = j; s0 < active; s0 += 8 * NG) {
            float4 v[8];
            #pragma unroll
            for (int k = 0; k < 8; ++k)
                if (s0 + k * NG < active)
                    v[k] = __ldcg(reinterpret_cast<const float4*>(src + (long long)(s0 + k * NG) * DA_GB * DA_DV));
            #pragma unroll
            for (int k = 0; k < 8; ++k) {
                if (s0 + k * NG >= active) break;
                const float e = wsplit[g * DA_MAX_SPLITS + s0 + k * NG];
                a.x = fmaf(e, v[k].x, a.x); a.y = fmaf(e, v[k].y, a.y);
                a.z = fmaf(e, v[k].z, a.z); a.w = fmaf(e, v[k].w, a.w);
            }
        }
        gsum[j * UA + u] = a;
    }
    __syncthreads();
    for (int u = tid; u < UA; u += DA_THREADS) {
        const int g = 4 * u / DA_DV, d = 4 * u % DA_DV;
        if (g >= ng) continue;
        float4 a = gsum[u];
        for (int j = 1; j < NG; ++j) {
            const float4 b = gsum[j * UA + u];
            a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
        }
        const float il = inv_l[g];
        *reinterpret_cast<float4*>(out + (long long)(h0 + g) * DA_DV + d) =
            float4{a.x * il, a.y * il, a.z * il, a.w * il};
    }
}
extern "C" __global__ void __launch_bounds__(DA_THREADS, DA_MIN_BLOCKS) decode_attention_f16(const float* q,
        const __half* K, const __half* V, float* pm, float* pl, float* pacc, int* cnt, float* out,
        const long long* p, int H, int Hkv, int S, float scale, int win, int min_chunk)
{ PDL_PROLOGUE(); decode_attention<__half, DA_STG_F16>(q, K, V, nullptr, nullptr, pm, pl, pacc, cnt, out, p, H, Hkv, S, scale, win, min_chunk); }
extern "C" __global__ void __launch_bounds__(DA_THREADS, DA_MIN_BLOCKS) decode_attention_i8(const float* q,
        const signed char* K, const signed char* V, const float* ks, const float* vs, float* pm,
        float* pl, float* pacc, int* cnt, float* out, const long long* p, int H, int Hkv, int S,
        float scale, int win, int min_chunk)
{ PDL_PROLOGUE(); decode_attention<signed char, DA_STG_I8>(q, K, V, ks, vs, pm, pl, pacc, cnt, out, p, H, Hkv, S, scale, win, min_chunk); }
