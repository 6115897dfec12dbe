// Attention of one query token for the head dims decode_attention.cu lacks (any multiple of 8),
// launched by kernels/decode_attention.py (tiled_attention); the same contract as decode_attention.cu.
#include "last_block_to_count.cuh"
#include "pdl.cuh"

#ifndef NEG_INF
#define NEG_INF (-__int_as_float(0x7f800000))
#endif
#define DEC_THREADS 128      // four warps
#define DEC_GB 4             // query heads a block serves: one warp each in the softmax
#define DEC_TILE 256         // keys whose scores sit in shared memory at once
#define DEC_MAX_SPLITS 64    // splits of the keys, each a block (per KV head and head group)
#define DEC_MAX_D 256        // key head dim
#define DEC_UNROLL 8         // K or V rows a lane has in flight
// the kernel is held to 168 registers (no spills, sm_90) so three blocks fit an SM; the wrapper
// sizes the grid on that (kernels/decode_attention.py, _tiled_resident_blocks)

#include "warp_reduce.cuh"
// eight consecutive cache values: one 16-byte (f16) or 8-byte (int8) load kept raw while in
// flight (half the registers of floats, so twice the loads in flight), then widened to floats
template <typename T> struct Raw8;
template <> struct Raw8<__half> { uint4 u; };
template <> struct Raw8<signed char> { uint2 u; };
__device__ __forceinline__ void dec_raw(const __half* p, Raw8<__half>& r) {
    r.u = *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void dec_raw(const signed char* p, Raw8<signed char>& r) {
    r.u = *reinterpret_cast<const uint2*>(p);
}
__device__ __forceinline__ void dec_cvt(const Raw8<__half>& r, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&r.u);
    for (int i = 0; i < 4; ++i) { float2 v = __half22float2(h[i]); f[2 * i] = v.x; f[2 * i + 1] = v.y; }
}
__device__ __forceinline__ void dec_cvt(const Raw8<signed char>& r, float* f) {
    const signed char* c = reinterpret_cast<const signed char*>(&r.u);
    for (int i = 0; i < 8; ++i) f[i] = (float)c[i];
}

// --- attention of one query token over keys 0..*pos (flash-decoding) ---------------------------
// Block (x = KV head hk and head group, y = split) serves up to DEC_GB query heads of KV head hk,
// so each K/V row is read once for all of them. The keys j0..pos are cut into the fewest splits
// of at least min_chunk keys (multiples of 16) that fit the grid's gridDim.y; blocks past the last
// split exit at once. A split walks its keys in tiles of DEC_TILE with a running max and sum.
// Scores: lpk lanes share one key row, 8 dims a lane (one wide load), eight keys a lane in flight,
// partial dots meet through shuffles. Values: Dv/8 lanes cover a row, the block's rows in
// parallel, eight rows a lane in flight. Each split writes its max, sum and weighted V; the block
// that finishes last (a counter per block column, reset by that block) merges them into out.
template <typename T> __device__ void decode_attention_tiled(
        const float* q, const T* K, const T* V, const float* ks, const float* vs, float* pm,
        float* pl, float* pacc, int* counters, float* out, const long long* pos_ptr, int H,
        int Hkv, int D, int Dv, int S_max, float scale, int window, int min_chunk) {
    __shared__ float qs[DEC_GB][DEC_MAX_D];
    __shared__ float sc[DEC_GB][DEC_TILE];
    __shared__ float part[DEC_THREADS * DEC_GB * 8];
    __shared__ float alpha[DEC_GB];
    __shared__ float wsplit[DEC_GB][DEC_MAX_SPLITS];
    __shared__ float inv_l[DEC_GB];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, NS = gridDim.y;
    const int G = H / Hkv, n_groups = (G + DEC_GB - 1) / DEC_GB;
    const int hk = blockIdx.x / n_groups, gb = blockIdx.x % n_groups;
    const int h0 = hk * G + gb * DEC_GB, ng = min(DEC_GB, G - gb * DEC_GB);
    const long long pos = *pos_ptr;
    const long long j0 = window > 0 ? max(0LL, pos - window + 1) : 0;
    const long long nk = pos + 1 - j0;
    long long chunk = (nk + NS - 1) / NS;
    chunk = max((long long)min_chunk, (chunk + 15) / 16 * 16);
    const int active = (int)((nk + chunk - 1) / chunk);
    const int split = blockIdx.y;
    if (split >= active) return;
    const long long lo = j0 + split * chunk, hi = min(pos + 1, lo + chunk);
    const long long slot = (long long)blockIdx.x * NS + split;

    for (int i = tid; i < DEC_GB * D; i += DEC_THREADS) {
        int g = i / D, d = i % D;
        qs[g][d] = g < ng ? q[(long long)(h0 + g) * D + d] : 0.f;
    }
    __syncthreads();
    int lpk = 1;                                   // lanes a key row: 8 dims each, a power of 2
    while (lpk * 8 < D) lpk <<= 1;
    const int kpw = 32 / lpk, li = lane % lpk, d0 = li * 8, sub = lane / lpk;
    const int kstep = 4 * kpw;                     // keys a block pass covers (four warps)
    float qr[DEC_GB][8];
    for (int g = 0; g < DEC_GB; ++g)
        for (int i = 0; i < 8; ++i) qr[g][i] = d0 < D ? qs[g][d0 + i] : 0.f;
    const int vl = Dv / 8, R = DEC_THREADS / vl;   // lanes a V row, V rows at once
    const int vr = tid / vl, vc = (tid % vl) * 8;
    float acc[DEC_GB][8];
    for (int g = 0; g < DEC_GB; ++g)
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    float m_run = NEG_INF, l_run = 0.f;            // warp g keeps head g's

    for (long long t0 = lo; t0 < hi; t0 += DEC_TILE) {
        const int tn = (int)min((long long)DEC_TILE, hi - t0);
        const T* Kt = K + ((long long)hk * S_max + t0) * D;
        for (int base = 0; base < tn; base += DEC_UNROLL * kstep) {   // uniform over the warp
            Raw8<T> raw[DEC_UNROLL] = {};
            int j[DEC_UNROLL];
            #pragma unroll
            for (int u = 0; u < DEC_UNROLL; ++u) {
                j[u] = base + u * kstep + warp * kpw + sub;
                if (j[u] < tn && d0 < D) dec_raw(Kt + (long long)j[u] * D + d0, raw[u]);
            }
            #pragma unroll
            for (int u = 0; u < DEC_UNROLL; ++u) {
                float f[8], s[DEC_GB];
                dec_cvt(raw[u], f);
                for (int g = 0; g < DEC_GB; ++g) {
                    float a = 0.f;
                    for (int i = 0; i < 8; ++i) a = fmaf(qr[g][i], f[i], a);
                    for (int o = lpk >> 1; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffff, a, o);
                    s[g] = a;
                }
                if (li == 0 && j[u] < tn) {
                    float kscale = ks ? ks[(long long)hk * S_max + t0 + j[u]] * scale : scale;
                    for (int g = 0; g < DEC_GB; ++g) sc[g][j[u]] = s[g] * kscale;
                }
            }
        }
        __syncthreads();
        if (warp < ng) {                           // softmax bookkeeping of head `warp`
            float m = NEG_INF;
            for (int jj = lane; jj < tn; jj += 32) m = fmaxf(m, sc[warp][jj]);
            float m_new = fmaxf(m_run, dec_warp_max(m));
            float sum = 0.f;
            for (int jj = lane; jj < tn; jj += 32) {
                float p = __expf(sc[warp][jj] - m_new);
                sc[warp][jj] = p;
                sum += p;
            }
            float a = __expf(m_run - m_new);       // 0 on the first tile
            l_run = l_run * a + dec_warp_sum(sum);
            m_run = m_new;
            if (lane == 0) alpha[warp] = a;
        }
        __syncthreads();
        if (vr < R) {
            for (int g = 0; g < DEC_GB; ++g)
                for (int i = 0; i < 8; ++i) acc[g][i] *= g < ng ? alpha[g] : 0.f;
            const T* Vt = V + ((long long)hk * S_max + t0) * Dv + vc;
            const float* vst = vs ? vs + (long long)hk * S_max + t0 : nullptr;
            for (int jb = vr; jb < tn; jb += DEC_UNROLL * R) {
                Raw8<T> raw[DEC_UNROLL];
                #pragma unroll
                for (int u = 0; u < DEC_UNROLL; ++u) {
                    int jj = jb + u * R;
                    if (jj < tn) dec_raw(Vt + (long long)jj * Dv, raw[u]);
                }
                #pragma unroll
                for (int u = 0; u < DEC_UNROLL; ++u) {
                    int jj = jb + u * R;
                    if (jj >= tn) break;
                    float f[8];
                    dec_cvt(raw[u], f);
                    float vsc = vst ? vst[jj] : 1.f;
                    for (int g = 0; g < DEC_GB; ++g) {
                        float w = sc[g][jj] * vsc;
                        for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(w, f[i], acc[g][i]);
                    }
                }
            }
        }
        __syncthreads();                           // sc is rewritten by the next tile
    }

    // the R row groups of this block meet in shared memory; one split: that is the output,
    // else the partial goes to global memory
    if (vr < R)
        for (int g = 0; g < DEC_GB; ++g)
            for (int i = 0; i < 8; ++i) part[(tid * DEC_GB + g) * 8 + i] = acc[g][i];
    if (warp < ng && lane == 0) inv_l[warp] = 1.f / l_run;
    __syncthreads();
    for (int idx = tid; idx < ng * Dv; idx += DEC_THREADS) {
        int g = idx / Dv, d = idx % Dv, c = d / 8, i = d % 8;
        float a = 0.f;
        for (int r = 0; r < R; ++r) a += part[((r * vl + c) * DEC_GB + g) * 8 + i];
        if (active == 1) out[(long long)(h0 + g) * Dv + d] = a * inv_l[g];
        else pacc[(slot * DEC_GB + g) * Dv + d] = a;
    }
    if (active == 1) return;
    if (warp < ng && lane == 0) { pm[slot * DEC_GB + warp] = m_run; pl[slot * DEC_GB + warp] = l_run; }

    if (!dec_last_of_column(counters, active)) return;   // the last block merges the splits
    const long long col = (long long)blockIdx.x * NS;
    if (warp < ng) {
        float M = NEG_INF;
        for (int s = lane; s < active; s += 32) M = fmaxf(M, __ldcg(pm + (col + s) * DEC_GB + warp));
        M = dec_warp_max(M);
        float L = 0.f;
        for (int s = lane; s < active; s += 32) {
            float e = __expf(__ldcg(pm + (col + s) * DEC_GB + warp) - M);
            wsplit[warp][s] = e;
            L += e * __ldcg(pl + (col + s) * DEC_GB + warp);
        }
        L = dec_warp_sum(L);
        if (lane == 0) inv_l[warp] = 1.f / L;
    }
    __syncthreads();
    // four output values a thread, eight splits' loads in flight: the merge is the tail of the
    // launch (one block a column works while the rest of the GPU waits), so it must not wait on
    // one L2 round trip per split
    const long long split_stride = (long long)DEC_GB * Dv;
    for (int idx = tid; idx < ng * Dv / 4; idx += DEC_THREADS) {
        int g = idx * 4 / Dv, d = idx * 4 % Dv;
        const float* src = pacc + (col * DEC_GB + g) * Dv + d;
        float4 a = {0.f, 0.f, 0.f, 0.f};
        for (int sp = 0; sp < active; sp += 8) {
            float4 v[8];
            #pragma unroll
            for (int u = 0; u < 8; ++u)
                if (sp + u < active)
                    v[u] = __ldcg(reinterpret_cast<const float4*>(src + (sp + u) * split_stride));
            #pragma unroll
            for (int u = 0; u < 8; ++u) {
                if (sp + u >= active) break;
                float w = wsplit[g][sp + u];
                a.x = fmaf(w, v[u].x, a.x); a.y = fmaf(w, v[u].y, a.y);
                a.z = fmaf(w, v[u].z, a.z); a.w = fmaf(w, v[u].w, a.w);
            }
        }
        float il = inv_l[g];
        float4 o = {a.x * il, a.y * il, a.z * il, a.w * il};
        *reinterpret_cast<float4*>(out + (long long)(h0 + g) * Dv + d) = o;
    }
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 3) decode_attention_tiled_f16(const float* q, const __half* K, const __half* V,
        float* pm, float* pl, float* pacc, int* cnt, float* out, const long long* p, int H,
        int Hkv, int D, int Dv, int S, float scale, int win, int min_chunk)
{ PDL_PROLOGUE(); decode_attention_tiled<__half>(q, K, V, nullptr, nullptr, pm, pl, pacc, cnt, out, p, H, Hkv, D, Dv, S, scale, win, min_chunk); }
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 3) decode_attention_tiled_i8(const float* q, const signed char* K,
        const signed char* V, const float* ks, const float* vs, float* pm, float* pl, float* pacc,
        int* cnt, float* out, const long long* p, int H, int Hkv, int D, int Dv, int S,
        float scale, int win, int min_chunk)
{ PDL_PROLOGUE(); decode_attention_tiled<signed char>(q, K, V, ks, vs, pm, pl, pacc, cnt, out, p, H, Hkv, D, Dv, S, scale, win, min_chunk); }
