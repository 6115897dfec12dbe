// The server's batched step against the paged KV pool (launched by kernels/paged_attention.py):
// RoPE of every row's q and k at the row's own position with k, v stored into the row's page slot,
// then decode attention of many sequences, each with its own length and block table, in one launch.
//
// Pool layout (lite/paged_kv.py BlockPool): K (n_blocks, Hkv, B, D), V (n_blocks, Hkv, B, Dv), f16
// or int8 with one f32 scale per (block, head, position), ks/vs (n_blocks, Hkv, B). Position p of a
// sequence lives in block table[p / B] at offset p % B.
#include "rope_row.cuh"

#define PA_MAX_ROW 1024          // the longest head row the rope-store kernel takes
#define PA_ROPE_THREADS 64
#define PA_WARPS 4               // warps of an attention block, each its own share of the keys
#define PA_GB 4                  // query heads (of one KV head) an attention block serves
#define PA_MAX_D 256             // head dims up to this: 8 values a lane
#define PA_VPL (PA_MAX_D / 32)
#define PA_NEG (-1e30f)          // a finite "no key yet", so empty warps and splits merge to zero weight

__device__ __forceinline__ float pa_load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float pa_load(const signed char* p) { return (float)*p; }

// --- RoPE + page store: grid (H + 2 * Hkv, R), a block a head row of one of the R rows -----------
// Blocks x < H rotate q head x of row y into q_out; the next Hkv rotate k heads into the pool at
// the row's slot (block * B + offset); the last Hkv copy the v heads there. n_rot = 0: no rotation.
// A row whose slot is negative (padding) stores nothing. int8 pools get scale = amax / 127 per
// (row, head), as lite/paged_kv.py's _quantize (rope_row.cuh).
template <typename T> __device__ void paged_rope_store(
        const float* q, const float* k, const float* v, float* q_out, T* Kp, T* Vp, float* ks,
        float* vs, const int* pos, const int* slots, int H, int Hkv, int D, int Dv, int B,
        int n_rot, double base, double freq_scale, int neox) {
    __shared__ float row[PA_MAX_ROW];
    __shared__ float wmax[PA_ROPE_THREADS / 32];
    const int b = blockIdx.x, r = blockIdx.y;
    const long long p = pos[r];
    const int slot = slots[r];
    if (b >= H && slot < 0) return;
    const long long page = slot < 0 ? 0 : (long long)(slot / B) * Hkv * B + slot % B;
    const float* src;
    float* fdst = nullptr;
    T* cdst = nullptr;
    float* sdst = nullptr;
    int n = D, rot = n_rot;
    if (b < H) {
        src = q + ((long long)r * H + b) * D;
        fdst = q_out + ((long long)r * H + b) * D;
    } else if (b < H + Hkv) {
        int h = b - H;
        src = k + ((long long)r * Hkv + h) * D;
        cdst = Kp + (page + (long long)h * B) * D;
        if (ks) sdst = ks + page + (long long)h * B;
    } else {
        int h = b - H - Hkv;
        src = v + ((long long)r * Hkv + h) * Dv;
        n = Dv;
        rot = 0;
        cdst = Vp + (page + (long long)h * B) * Dv;
        if (vs) sdst = vs + page + (long long)h * B;
    }
    rope_row(row, src, n, rot, p, base, freq_scale, neox, nullptr, 1.f);
    __syncthreads();
    store_row(row, n, fdst, cdst, sdst, wmax);
}
extern "C" __global__ void paged_rope_store_f16(const float* q, const float* k, const float* v,
        float* q_out, __half* Kp, __half* Vp, const int* pos, const int* slots, int H, int Hkv,
        int D, int Dv, int B, int n_rot, double base, double fs, int neox)
{ paged_rope_store<__half>(q, k, v, q_out, Kp, Vp, nullptr, nullptr, pos, slots, H, Hkv, D, Dv, B, n_rot, base, fs, neox); }
extern "C" __global__ void paged_rope_store_i8(const float* q, const float* k, const float* v,
        float* q_out, signed char* Kp, signed char* Vp, float* ks, float* vs, const int* pos,
        const int* slots, int H, int Hkv, int D, int Dv, int B, int n_rot, double base, double fs,
        int neox)
{ paged_rope_store<signed char>(q, k, v, q_out, Kp, Vp, ks, vs, pos, slots, H, Hkv, D, Dv, B, n_rot, base, fs, neox); }

// --- decode attention over pages: grid (columns * splits, N), PA_WARPS warps a block -------------
// Sequence y's query is row rows[y] of q (R, H, D) f32; it attends to its keys max(0, L - window)
// .. L - 1 (L = lens[y]; window 0: all) through its block table tables[y] (max_blocks entries).
// A column is one KV head and up to PA_GB of its query heads (GQA: the K/V row is read once for
// them); the keys of a sequence are cut into `splits` ranges, a block each. Within a block each
// warp walks its share of the keys with an online softmax (a key a step: the lanes split the head
// dims, a warp sum gives the score), then the warps merge in shared memory. One split: the block
// writes out[rows[y]] (R, H * Dv) itself; more: it writes its (max, sum, weighted values) into
// pm, pl (N, H, splits) and pacc (N, H, splits, Dv) for paged_attention_merge.
template <typename T> __device__ void paged_attention(
        const float* q, const int* rows, const int* lens, const int* tables, const T* Kp,
        const T* Vp, const float* ks, const float* vs, float* out, float* pm, float* pl,
        float* pacc, int H, int Hkv, int D, int Dv, int B, int max_blocks, int splits,
        float scale, int window) {
    __shared__ float qs[PA_GB][PA_MAX_D];
    __shared__ float wm[PA_WARPS][PA_GB], wl[PA_WARPS][PA_GB];
    __shared__ float wacc[PA_WARPS][PA_GB][PA_MAX_D];
    const int n = blockIdx.y, col = blockIdx.x / splits, sp = blockIdx.x % splits;
    const int G = H / Hkv, cols_per_kv = (G + PA_GB - 1) / PA_GB;
    const int hk = col / cols_per_kv, g0 = (col % cols_per_kv) * PA_GB;
    const int ng = min(PA_GB, G - g0), h0 = hk * G + g0;
    const int L = lens[n], row = rows[n];
    const int j0 = window > 0 ? max(0, L - window) : 0;
    const int per = (L - j0 + splits - 1) / splits;
    const int ja = j0 + sp * per, jb = min(L, ja + per);
    const int* table = tables + (long long)n * max_blocks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < ng * D; i += blockDim.x)
        qs[i / D][i % D] = q[((long long)row * H + h0 + i / D) * D + i % D] * scale;
    __syncthreads();
    float m[PA_GB], l[PA_GB], acc[PA_GB][PA_VPL];
#pragma unroll
    for (int g = 0; g < PA_GB; ++g) {
        m[g] = PA_NEG;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < PA_VPL; ++i) acc[g][i] = 0.f;
    }
    for (int j = ja + warp; j < jb; j += PA_WARPS) {        // uniform over the warp
        const long long at = ((long long)table[j / B] * Hkv + hk) * B + j % B;
        const T* kr = Kp + at * D;
        const T* vr = Vp + at * Dv;
        const float kscale = ks ? ks[at] : 1.f, vscale = vs ? vs[at] : 1.f;
        float kv[PA_VPL], vv[PA_VPL];
#pragma unroll
        for (int i = 0; i < PA_VPL; ++i) {
            int d = lane + 32 * i;
            kv[i] = d < D ? pa_load(kr + d) : 0.f;
            vv[i] = d < Dv ? pa_load(vr + d) * vscale : 0.f;
        }
#pragma unroll
        for (int g = 0; g < PA_GB; ++g) {
            if (g >= ng) break;                              // uniform over the block
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < PA_VPL; ++i) {
                int d = lane + 32 * i;
                if (d < D) s += qs[g][d] * kv[i];
            }
            s = dec_warp_sum(s) * kscale;
            float mn = fmaxf(m[g], s), corr = __expf(m[g] - mn), pr = __expf(s - mn);
            l[g] = l[g] * corr + pr;
#pragma unroll
            for (int i = 0; i < PA_VPL; ++i) acc[g][i] = acc[g][i] * corr + pr * vv[i];
            m[g] = mn;
        }
    }
#pragma unroll
    for (int g = 0; g < PA_GB; ++g) {
        if (lane == 0) { wm[warp][g] = m[g]; wl[warp][g] = l[g]; }
#pragma unroll
        for (int i = 0; i < PA_VPL; ++i) {
            int d = lane + 32 * i;
            if (d < Dv) wacc[warp][g][d] = acc[g][i];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ng * Dv; i += blockDim.x) {
        const int g = i / Dv, d = i % Dv, h = h0 + g;
        float M = PA_NEG;
        for (int w = 0; w < PA_WARPS; ++w) M = fmaxf(M, wm[w][g]);
        float num = 0.f, den = 0.f;
        for (int w = 0; w < PA_WARPS; ++w) {
            float e = __expf(wm[w][g] - M);
            num += wacc[w][g][d] * e;
            den += wl[w][g] * e;
        }
        if (splits == 1) {
            out[((long long)row * H + h) * Dv + d] = num / den;
        } else {
            const long long at = ((long long)n * H + h) * splits + sp;
            pacc[at * Dv + d] = num;
            if (d == 0) { pm[at] = M; pl[at] = den; }
        }
    }
}
extern "C" __global__ void __launch_bounds__(32 * PA_WARPS) paged_attention_f16(
        const float* q, const int* rows, const int* lens, const int* tables, const __half* Kp,
        const __half* Vp, float* out, float* pm, float* pl, float* pacc, int H, int Hkv, int D,
        int Dv, int B, int max_blocks, int splits, float scale, int window)
{ paged_attention<__half>(q, rows, lens, tables, Kp, Vp, nullptr, nullptr, out, pm, pl, pacc, H, Hkv, D, Dv, B, max_blocks, splits, scale, window); }
extern "C" __global__ void __launch_bounds__(32 * PA_WARPS) paged_attention_i8(
        const float* q, const int* rows, const int* lens, const int* tables,
        const signed char* Kp, const signed char* Vp, const float* ks, const float* vs, float* out,
        float* pm, float* pl, float* pacc, int H, int Hkv, int D, int Dv, int B, int max_blocks,
        int splits, float scale, int window)
{ paged_attention<signed char>(q, rows, lens, tables, Kp, Vp, ks, vs, out, pm, pl, pacc, H, Hkv, D, Dv, B, max_blocks, splits, scale, window); }

// The splits of every (sequence, head) merged: grid (H, N), out[rows[y]] (R, H * Dv).
extern "C" __global__ void paged_attention_merge(const float* pm, const float* pl,
        const float* pacc, const int* rows, float* out, int H, int Dv, int splits) {
    const int h = blockIdx.x, n = blockIdx.y;
    const long long at = ((long long)n * H + h) * splits;
    float M = PA_NEG;
    for (int s = 0; s < splits; ++s) M = fmaxf(M, pm[at + s]);
    float den = 0.f;
    for (int s = 0; s < splits; ++s) den += pl[at + s] * __expf(pm[at + s] - M);
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float num = 0.f;
        for (int s = 0; s < splits; ++s) num += pacc[(at + s) * Dv + d] * __expf(pm[at + s] - M);
        out[((long long)rows[n] * H + h) * Dv + d] = num / den;
    }
}
