"""CUDA C source of the grouped mixture-of-experts kernels (kernels/moe_cuda.py compiles and
launches them): routing, top-k, the expert sort, the fused grouped matvec."""
from lite.kernels.pdl import C_PDL

# The activation of gate and up: moe_act_f32/f16 here, and moe_mvw's gated form (kernels/moe_mvw.py),
# which is compiled with C_MV: both modules take it from this one text.
C_MOE_ACT = r"""
#ifndef LT_MOE_ACT
#define LT_MOE_ACT
// The CPU backend's formulas (lite/backends/cpu.py act_mul).
__device__ __forceinline__ float moe_act(float g, float u, int gelu) {
    if (!gelu) return g / (1.f + expf(-g)) * u;
    const float c = 0.7978845608028654f;
    return 0.5f * g * (1.f + tanhf(c * (g + 0.044715f * g * g * g))) * u;
}
#endif
"""

C_MOE = C_PDL + C_MOE_ACT + r"""
#define FULL 0xffffffffu
#define MAXE 512
#define AT 512
#ifndef LITE_HOST_SHIM
__device__ __forceinline__ unsigned short moe_f2h(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#endif

extern "C" __global__ void moe_logits(const float* __restrict__ h, const float* __restrict__ w,
        float* __restrict__ logits, int T, int n_embd, int n_expert) {
    PDL_PROLOGUE();                            // (LITE_PDL: kernels/pdl.py)
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

extern "C" __global__ void moe_gather_x16(const float* __restrict__ x, const int* __restrict__ blk_rows,
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
extern "C" __global__ void moe_ptrs(const int* __restrict__ blk_expert, const int* __restrict__ rank,
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
// of 256 threads, grid (column blocks, tokens): a thread a column, its k loads issued together (one
// block a token, each thread walking 8 columns one expert at a time, took 12.6 us a decode step's
// layer on the H200, session 5: serial L2 latency).
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
"""

C_MV = C_MOE_ACT + r"""
template <class T, int N, int R>
__global__ void __launch_bounds__(128) moe_mv(
        const unsigned char* __restrict__ w0, const unsigned char* __restrict__ w1, long long ebytes,
        const int* __restrict__ slot_of, const float* __restrict__ x, float* __restrict__ out0,
        float* __restrict__ out1, const int* __restrict__ blk_expert, const int* __restrict__ blk_rows,
        int kdiv, int S, int rows, int cols, int x_by_row) {
    const int b = blockIdx.y;
    const int e = blk_expert[b];
    if (e < 0) return;
    const int slot = slot_of ? slot_of[e] : e;
    if (slot < 0) return;                      // not resident this round
    T::init();                                 // per-type tables in shared memory (IQ grids); the
                                               // returns above are uniform over the block
    const unsigned char* w = (blockIdx.z ? w1 : w0) + (long long)slot * ebytes;
    float* out = blockIdx.z ? out1 : out0;
    int xr[N];                                 // the token of padded row b*N+n, -1 = padding
    #pragma unroll
    for (int n = 0; n < N; n++) {
        const int i = b * N + n;
        xr[n] = blk_rows ? blk_rows[i] : (i < S ? i / kdiv : -1);
    }
    // x_by_row: x is already in padded-row order (the down product reads the activations of gate
    // and up, one row per token-slot), so row i reads x row i, not its token's row. Padding rows
    // read row b*N (row 0 of a used block is always real) and are not written.
    const float* xp[N];
    #pragma unroll
    for (int n = 0; n < N; n++) {
        const int i = b * N + n;
        const int src = x_by_row ? (xr[n] >= 0 ? i : b * N) : (xr[n] >= 0 ? xr[n] : xr[0]);
        xp[n] = x + (long long)src * cols;
    }
    const int row0 = blockIdx.x * R, nb = cols / T::BE, chunks = nb * T::CPB;
    const long long rb = (long long)nb * T::TS;
    const unsigned char* rowp[R];
    #pragma unroll
    for (int r = 0; r < R; r++) rowp[r] = w + (long long)min(row0 + r, rows - 1) * rb;
    float acc[R][N];
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    for (int c = threadIdx.x; c < chunks; c += 128) {
        typename T::Raw cur[R];
        #pragma unroll
        for (int r = 0; r < R; r++) T::load(cur[r], rowp[r], c);
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float4 xv[8];
            float xa, xb;
            load_x<T>(xp[n], c, xv, xa, xb);
            #pragma unroll
            for (int r = 0; r < R; r++) acc[r][n] += T::dot(cur[r], c, xv, xa, xb);
        }
    }
    __shared__ float red[4][R * N];
    const float total = block_sum<R, N>(acc, red);
    if (threadIdx.x < R * N) {
        const int r = threadIdx.x / N, n = threadIdx.x % N;
        if (row0 + r < rows && xr[n] >= 0) out[(long long)(b * N + n) * rows + row0 + r] = total;
    }
}
"""

# IQ4_XS as a type of moe_mv (the IQ3_XXS one is kernels/matvec_iq.py's TIQ3_XXS, shared with the
# persistent matvec). The decode is matvec_iq.py's mv_iq4xs (checked against gguf-py), a chunk =
# a 32-weight sub-block; the 16 levels sit in shared memory. Blocks are 136 bytes, so with an
# 8-aligned base every block and its qs (at 8 + 16 ib) are 8-aligned: uint2 loads.
C_TIQ4_XS = r"""
__shared__ float lt_iq4_kv[16];
struct TIQ4_XS {   // d (f16), scales_h (u16), scales_l[4], qs[128]; sub-block ib: 16 bytes at 8 + 16 ib,
                   // low nibbles are values 0..15, high nibbles 16..31; 6-bit scale (low 4 | high 2 << 4) - 32
    static constexpr int BE = 256, TS = 136, CPB = 8;
    struct Raw { uint2 lo, hi; unsigned w0, w1; };
    __device__ static __forceinline__ void init() {
        if (threadIdx.x < 16) lt_iq4_kv[threadIdx.x] = (float)IQ4_KVALUES[threadIdx.x];
        __syncthreads();
    }
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* b = row + (c >> 3) * TS;
        const int ib = c & 7;
        r.lo = __ldg((const uint2*)(b + 8 + 16 * ib));
        r.hi = __ldg((const uint2*)(b + 16 + 16 * ib));
        r.w0 = __ldg((const unsigned*)b);
        r.w1 = __ldg((const unsigned*)(b + 4));
    }
    __device__ static __forceinline__ int xoff(int c, int k) { return 32 * c + 4 * k; }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float, float) {
        const int ib = c & 7;
        const int ls = (int)(((r.w1 >> (8 * (ib >> 1) + 4 * (ib & 1))) & 15u) | (((r.w0 >> (16 + 2 * ib)) & 3u) << 4));
        const unsigned qw[4] = {r.lo.x, r.lo.y, r.hi.x, r.hi.y};
        return h2f((unsigned short)(r.w0 & 0xffffu)) * (float)(ls - 32) * iq4_dot32(qw, xv, lt_iq4_kv);
    }
};
"""

# dequant_basic's kernel signature and the gathered variant's (y = blockIdx.y picks sel[y]).
