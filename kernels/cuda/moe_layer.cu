// The MoE layer's kernels besides the expert products (kernels/moe_layer.py launches them): router
// logits, top-k, the expert sort (moe_align), the combine, and the batched-GEMM path's glue.
#include "pdl.cuh"
#include "moe_activation.cuh"

#define FULL 0xffffffffu
#define MAXE 512
#define AT 512
#ifndef LITE_HOST_SHIM
__device__ __forceinline__ unsigned short moe_f2h(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#endif

extern "C" __global__ void moe_logits(const float* __restrict__ h, const float* __restrict__ w,
        float* __restrict__ logits, int T, int n_embd, int n_expert) {
    PDL_PROLOGUE();                            // (pdl.cuh)
    const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (gw >= T * n_expert) return;            // whole warps leave together
    const float* a = h + (long long)(gw / n_expert) * n_embd;
    const float* b = w + (long long)(gw % n_expert) * n_embd;
    float s = 0.f;
    for (int i = lane; i < n_embd; i += 32) s = fmaf(a[i], b[i], s);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    if (lane == 0) logits[gw] = s;
}

// V values a lane: n_expert <= 32 * V.
template <int V>
__global__ void moe_topk(const float* __restrict__ logits, int* __restrict__ ids, float* __restrict__ wts,
                         int T, int n_expert, int k, int normalize) {
    PDL_PROLOGUE();
    const int t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (t >= T) return;
    const float* l = logits + (long long)t * n_expert;
    float p[V];
    float m = -__int_as_float(0x7f800000);
    #pragma unroll
    for (int i = 0; i < V; i++) {
        const int e = lane + 32 * i;
        p[i] = e < n_expert ? l[e] : -__int_as_float(0x7f800000);
        m = fmaxf(m, p[i]);
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL, m, o));
    float s = 0.f;
    #pragma unroll
    for (int i = 0; i < V; i++) {
        const bool ok = lane + 32 * i < n_expert;
        p[i] = ok ? expf(p[i] - m) : -1.f;     // -1: never chosen (probabilities are >= 0)
        if (ok) s += p[i];
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    #pragma unroll
    for (int i = 0; i < V; i++) if (p[i] >= 0.f) p[i] = p[i] / s;
    float tot = 0.f;
    for (int j = 0; j < k; j++) {
        float bv = -1.f; int bi = 0x7fffffff;
        #pragma unroll
        for (int i = 0; i < V; i++) if (p[i] > bv) { bv = p[i]; bi = lane + 32 * i; }   // lowest index on ties
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(FULL, bv, o); const int oi = __shfl_xor_sync(FULL, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        #pragma unroll
        for (int i = 0; i < V; i++) if (lane + 32 * i == bi) p[i] = -2.f;
        if (lane == 0) { ids[t * k + j] = bi; wts[t * k + j] = bv; }
        tot += bv;
    }
    if (normalize && lane == 0)
        for (int j = 0; j < k; j++) wts[t * k + j] = wts[t * k + j] / tot;
}

extern "C" __global__ void __launch_bounds__(AT) moe_align(
        const int* __restrict__ ids, int S, int k, int n_expert, int bm, int nb_max,
        int* __restrict__ blk_expert, int* __restrict__ blk_rows, int* __restrict__ pos,
        int* __restrict__ used_list, int* __restrict__ rank, int* __restrict__ meta) {
    __shared__ int cnt[MAXE], start[MAXE], fill[MAXE];
    __shared__ int wc[AT / 32][MAXE];          // per-warp counts, then their running bases
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int e = tid; e < n_expert; e += AT) cnt[e] = 0;
    for (int b = tid; b < nb_max; b += AT) blk_expert[b] = -1;
    for (long long i = tid; i < (long long)nb_max * bm; i += AT) blk_rows[i] = -1;
    __syncthreads();
    for (int s = tid; s < S; s += AT) atomicAdd(&cnt[ids[s]], 1);
    __syncthreads();
    if (tid == 0) {                            // n_expert <= 512 steps: cheaper than a scan's syncs
        int b = 0, u = 0;
        for (int e = 0; e < n_expert; e++) {
            start[e] = b * bm; fill[e] = 0;
            rank[e] = cnt[e] ? u : -1;
            if (cnt[e]) { used_list[u++] = e; b += (cnt[e] + bm - 1) / bm; }
        }
        for (int i = u; i < n_expert; i++) used_list[i] = -1;
        meta[0] = b; meta[1] = u;
    }
    __syncthreads();
    for (int e = tid; e < n_expert; e += AT)
        for (int j = 0, nb = (cnt[e] + bm - 1) / bm; j < nb; j++) blk_expert[start[e] / bm + j] = e;
    for (int s0 = 0; s0 < S; s0 += AT) {
        for (int i = tid; i < (AT / 32) * n_expert; i += AT) wc[i / n_expert][i % n_expert] = 0;
        __syncthreads();
        const int s = s0 + tid;
        const int e = s < S ? ids[s] : -1;
        const unsigned peers = __match_any_sync(FULL, e);
        const int lr = __popc(peers & ((1u << lane) - 1u));      // earlier lanes with the same expert
        if (e >= 0 && lr == 0) wc[warp][e] = __popc(peers);
        __syncthreads();
        for (int x = tid; x < n_expert; x += AT) {
            int run = fill[x];
            for (int w = 0; w < AT / 32; w++) { const int c = wc[w][x]; wc[w][x] = run; run += c; }
            fill[x] = run;
        }
        __syncthreads();
        if (e >= 0) {
            const int p = start[e] + wc[warp][e] + lr;
            pos[s] = p;
            blk_rows[p] = s / k;
        }
        __syncthreads();
    }
}

extern "C" __global__ void moe_gather_rows_f16(const float* __restrict__ x, const int* __restrict__ blk_rows,
                                          unsigned short* __restrict__ xs, int cols) {
    const int r = blk_rows[blockIdx.x];
    unsigned short* o = xs + (long long)blockIdx.x * cols;
    const float* a = x + (long long)(r < 0 ? 0 : r) * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = r < 0 ? (unsigned short)0 : moe_f2h(a[c]);
}

extern "C" __global__ void moe_act_f32(const float* __restrict__ g, const float* __restrict__ u,
                                       float* __restrict__ h, long long n, int gelu) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        h[i] = moe_act(g[i], u[i], gelu);
}
extern "C" __global__ void moe_act_f16(const float* __restrict__ g, const float* __restrict__ u,
                                       unsigned short* __restrict__ h, long long n, int gelu) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        h[i] = moe_f2h(moe_act(g[i], u[i], gelu));
}

// Pointer arrays for the two batched GEMMs. Batch entry b (and nb_max + b for up) is block b:
// A = its expert's dequantized weights (compact index rank[e]), B = its bm input rows, C = its bm
// output rows. Blocks that are unused, or whose expert is not resident this round (slot_of[e] < 0),
// still run (cuBLAS batches are uniform) on compact weights 0, and write the down product into
// `dummy`, so that rows computed in an earlier round are never overwritten.
typedef unsigned long long u64;
extern "C" __global__ void moe_gemm_pointers(const int* __restrict__ blk_expert, const int* __restrict__ rank,
        const int* __restrict__ slot_of, int nb_max, u64 wg, u64 wu, u64 wd, long long w_bytes,
        u64 xs, long long xs_bytes, u64 g, u64 u, long long gu_bytes, u64 h16, long long h_bytes,
        u64 y, long long y_bytes, u64 dummy, u64* __restrict__ pa, u64* __restrict__ pb,
        u64* __restrict__ pc, u64* __restrict__ da, u64* __restrict__ db, u64* __restrict__ dc) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nb_max) return;
    const int e = blk_expert[b];
    const bool live = e >= 0 && (slot_of == 0 || slot_of[e] >= 0);
    const long long c = live ? (long long)(rank ? rank[e] : e) : 0;
    pa[b] = wg + c * w_bytes;            pa[nb_max + b] = wu + c * w_bytes;
    pb[b] = xs + b * xs_bytes;           pb[nb_max + b] = xs + b * xs_bytes;
    pc[b] = g + b * gu_bytes;            pc[nb_max + b] = u + b * gu_bytes;
    da[b] = wd + c * w_bytes;  db[b] = h16 + b * h_bytes;  dc[b] = live ? y + b * y_bytes : dummy;
}

// out[t] = sum_j w[t, j] * y[pos[t*k + j]] (pos NULL: the identity), in slot order; plus res[t]
// (not NULL: the residual add after the MoE block, the add of `x + moe` in the same fp32). Blocks
// of 256 threads, grid (column blocks, tokens): a thread a column, its k loads issued together (a
// block a token walking columns one expert at a time was bound by serial L2 latency).
extern "C" __global__ void moe_combine(const float* __restrict__ y, const int* __restrict__ pos,
        const float* __restrict__ w, float* __restrict__ out, int k, int n_embd,
        const float* __restrict__ res) {
    PDL_PROLOGUE();
    const int t = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < n_embd; c += blockDim.x * gridDim.x) {
        float s = 0.f;
        #pragma unroll 8
        for (int j = 0; j < k; j++) {
            const int p = pos ? pos[t * k + j] : t * k + j;
            s = __fadd_rn(s, __fmul_rn(w[t * k + j], y[(long long)p * n_embd + c]));
        }
        if (res) s = __fadd_rn(res[(long long)t * n_embd + c], s);
        out[(long long)t * n_embd + c] = s;
    }
}
