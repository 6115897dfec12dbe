// The Gated DeltaNet's kernels (qwen3next's recurrent layers), launched by kernels/delta_rule.py:
// the causal depthwise conv + silu with its carried window, the L2 norm of q and k, the gates, the
// delta rule as one decode step and in its chunked form (prefill), and gated attention's
// x * sigmoid(gate). float32 throughout; the semantics are lite/backends/cpu_recurrent.py's.
//
// Set by the wrapper: DR_DK (key head dim), DR_DVT (value columns a chunked block), DR_BT (the
// chunk), DR_NT (threads a chunked block), DR_NW (warps a decode block), DR_SMEM (the chunked
// block's dynamic shared bytes).

#include "last_block_to_count.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
#define DR_DYN_SMEM(name) extern __shared__ __align__(16) float name[]
#else   // host emulation (tests/cuda_c_emulator.py): blocks run one at a time
#define DR_DYN_SMEM(name) alignas(16) static float name[DR_SMEM / 4]
#endif

__device__ __forceinline__ float dr_warp_sum(float s) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    return s;
}

// y (T, C) = silu(sum_j full[t + j] * w[c, j]), full = [state (K-1, C); x (T, C)]; then state =
// the last K-1 rows of full. A block takes 32 channels (a lane each) and all T rows, its warps
// taking rows in turn; the window is replaced only after every warp has read it (the barrier),
// each channel's rows in increasing order (a row is read before its own row is written).
extern "C" __global__ void conv_silu(const float* x, const float* w, float* state, float* y,
                                     int T, int C, int K) {
    const int c = blockIdx.x * 32 + (threadIdx.x & 31);
    const int ty = threadIdx.x >> 5, ny = blockDim.x >> 5;
    if (c < C) {
        for (int t = ty; t < T; t += ny) {
            float acc = 0.f;
            for (int j = 0; j < K; ++j) {
                const int r = t + j - (K - 1);      // row of x; below 0: a row of the window
                const float v = r < 0 ? state[(long long)(K - 1 + r) * C + c] : x[(long long)r * C + c];
                acc += v * w[(long long)c * K + j];
            }
            y[(long long)t * C + c] = acc / (1.f + expf(-acc));
        }
    }
    __syncthreads();
    if (c < C && ty == 0) {
        for (int r = 0; r < K - 1; ++r) {
            const int src = T + r;                  // its row of full
            state[(long long)r * C + c] = src < K - 1 ? state[(long long)src * C + c]
                                                      : x[(long long)(src - (K - 1)) * C + c];
        }
    }
}

// y = x / sqrt(sum x^2 + eps) over rows of n: a warp a row.
extern "C" __global__ void l2_norm(const float* x, float* y, int rows, int n, float eps) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (row >= rows) return;                        // whole warps leave together
    const float* xr = x + (long long)row * n;
    float s = 0.f;
    for (int i = lane; i < n; i += 32) s += xr[i] * xr[i];
    const float r = 1.f / sqrtf(dr_warp_sum(s) + eps);
    for (int i = lane; i < n; i += 32) y[(long long)row * n + i] = xr[i] * r;
}

// beta = sigmoid(b); g = A * softplus(a + dt_bias), the log decay; b, a, g, beta (T, Hv).
extern "C" __global__ void delta_gates(const float* b, const float* a, const float* A,
                                       const float* dt_bias, float* g, float* beta, int n, int Hv) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int h = i % Hv;
    beta[i] = 1.f / (1.f + expf(-b[i]));
    const float z = a[i] + dt_bias[h];
    g[i] = A[h] * (fmaxf(z, 0.f) + log1pf(expf(-fabsf(z))));    // softplus without overflow
}

// y = x * sigmoid(gate), elementwise over n values.
extern "C" __global__ void sigmoid_mul(const float* x, const float* gate, float* y, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * (1.f / (1.f + expf(-gate[i])));
}

// One token of the delta rule for value head h, the columns of one block: S (dk, dv) of the head
// in place: S = exp(g) S; d = beta (v - S^T k); S += k d^T; out = scale S^T q. A lane a column
// (its v value vc), the DR_NW warps each a slice of the dk rows (q, k in shared memory), held in
// registers between the two passes; the warps' partial sums meet in red and red2.
#define DR_RPW ((DR_DK + DR_NW - 1) / DR_NW)       // rows a warp
__device__ __forceinline__ void dr_decode_columns(const float* sq, const float* sk, float vc,
                                                  float decay, float b, float* Sh, float* out_h,
                                                  int dv, int col, float scale,
                                                  float (*red)[32], float (*red2)[32]) {
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const bool live = col < dv;
    float s[DR_RPW];
    float part = 0.f;
    #pragma unroll
    for (int r = 0; r < DR_RPW; ++r) {
        const int i = wp * DR_RPW + r;
        s[r] = (live && i < DR_DK) ? Sh[(long long)i * dv + col] * decay : 0.f;
        if (i < DR_DK) part += s[r] * sk[i];
    }
    red[wp][lane] = part;
    __syncthreads();
    float sk_tot = 0.f;
    for (int w = 0; w < DR_NW; ++w) sk_tot += red[w][lane];
    const float d = live ? b * (vc - sk_tot) : 0.f;
    float part2 = 0.f;
    #pragma unroll
    for (int r = 0; r < DR_RPW; ++r) {
        const int i = wp * DR_RPW + r;
        if (i < DR_DK) {
            s[r] += sk[i] * d;
            if (live) Sh[(long long)i * dv + col] = s[r];
            part2 += s[r] * sq[i];
        }
    }
    red2[wp][lane] = part2;
    __syncthreads();
    if (wp == 0 && live) {
        float o = 0.f;
        for (int w = 0; w < DR_NW; ++w) o += red2[w][lane];
        out_h[col] = o * scale;
    }
}

// One token of the delta rule: per value head h (key head h / (Hv / Hk)), S of S (Hv, dk, dv) in
// place. A block a (head, 32 columns). Fixed shapes: capturable in a CUDA graph.
extern "C" __global__ void delta_rule_decode(const float* q, const float* k, const float* v,
                                             const float* g, const float* beta, float* S,
                                             float* out, int Hk, int Hv, int dv, float scale) {
    __shared__ float sq[DR_DK], sk[DR_DK];
    __shared__ float red[DR_NW][32], red2[DR_NW][32];
    const int h = blockIdx.x, hk = h / (Hv / Hk);
    const int col = blockIdx.y * 32 + (threadIdx.x & 31);
    for (int i = threadIdx.x; i < DR_DK; i += blockDim.x) {
        sq[i] = q[(long long)hk * DR_DK + i];
        sk[i] = k[(long long)hk * DR_DK + i];
    }
    __syncthreads();
    const float vc = col < dv ? v[(long long)h * dv + col] : 0.f;
    dr_decode_columns(sq, sk, vc, expf(g[h]), beta[h], S + (long long)h * DR_DK * dv,
                      out + (long long)h * dv, dv, col, scale, red, red2);
}

// silu of channel c's causal conv for one token: the window's K-1 rows (K-1, C), then x's row.
__device__ __forceinline__ float dr_conv_silu_one(const float* x, const float* w, const float* window,
                                                  int c, int C, int K) {
    float acc = 0.f;
    for (int j = 0; j < K; ++j)
        acc += (j < K - 1 ? window[(long long)j * C + c] : x[c]) * w[(long long)c * K + j];
    return acc / (1.f + expf(-acc));
}

// The window of channel c after the token x: its rows move up one, x's row last.
__device__ __forceinline__ void dr_window_push(const float* x, float* window, int c, int C, int K) {
    for (int r = 0; r + 1 < K; ++r)
        window[(long long)r * C + c] = r + 2 < K ? window[(long long)(r + 1) * C + c] : x[c];
}

// One token of a Gated DeltaNet layer in one launch (decode), from the projections: qkv (C) before
// the conv, rows [q of Hk key heads | k | v of Hv value heads]; ba (Hk, 2r), per key head [b | a]
// of its r value heads. Does what conv_silu, l2_norm (q and k), delta_gates and delta_rule_decode
// do, in their order of operations. A block a (value head, 32 columns) as delta_rule_decode; every
// block of a key head computes its q and k. The window (K-1, C) moves on in place: a v channel's
// by the one block that reads it, q's and k's by the last block of the key head to have read
// them (counters: Hk ints, zero before and after). Fixed shapes: capturable.
extern "C" __global__ void delta_decode_fused(const float* qkv, const float* ba, const float* conv_w,
                                              float* window, const float* A, const float* dt_bias,
                                              float* S, float* out, int* counters, int Hk, int Hv,
                                              int dv, int K, float eps, float scale) {
    __shared__ float sq[DR_DK], sk[DR_DK];
    __shared__ float red[DR_NW][32], red2[DR_NW][32];
    const int r = Hv / Hk, h = blockIdx.x, hk = h / r, C = 2 * Hk * DR_DK + Hv * dv;
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, col = blockIdx.y * 32 + lane;
    for (int i = threadIdx.x; i < 2 * DR_DK; i += blockDim.x) {
        const int c = (i < DR_DK ? 0 : Hk * DR_DK - DR_DK) + hk * DR_DK + i;   // q, then k
        const float y = dr_conv_silu_one(qkv, conv_w, window, c, C, K);
        if (i < DR_DK) sq[i] = y; else sk[i - DR_DK] = y;
    }
    const int cv = 2 * Hk * DR_DK + h * dv + col;
    const float vc = col < dv ? dr_conv_silu_one(qkv, conv_w, window, cv, C, K) : 0.f;
    __syncthreads();
    float ssq = 0.f, ssk = 0.f;                     // every warp both sums, in l2_norm's order
    for (int i = lane; i < DR_DK; i += 32) {
        ssq += sq[i] * sq[i];
        ssk += sk[i] * sk[i];
    }
    const float rq = 1.f / sqrtf(dr_warp_sum(ssq) + eps), rk = 1.f / sqrtf(dr_warp_sum(ssk) + eps);
    __syncthreads();                                // every warp has read sq, sk
    for (int i = threadIdx.x; i < DR_DK; i += blockDim.x) {
        sq[i] *= rq;
        sk[i] *= rk;
    }
    __syncthreads();
    const int j = hk * 2 * r + h % r;               // b of head h; its a r further
    const float b = 1.f / (1.f + expf(-ba[j]));
    const float z = ba[j + r] + dt_bias[h];
    const float g = A[h] * (fmaxf(z, 0.f) + log1pf(expf(-fabsf(z))));
    dr_decode_columns(sq, sk, vc, expf(g), b, S + (long long)h * DR_DK * dv,
                      out + (long long)h * dv, dv, col, scale, red, red2);
    if (wp == 0 && col < dv) dr_window_push(qkv, window, cv, C, K);   // read before the barriers
    if (last_block_to_count(counters + hk, r * gridDim.y))
        for (int i = threadIdx.x; i < 2 * DR_DK; i += blockDim.x)
            dr_window_push(qkv, window, (i < DR_DK ? 0 : Hk * DR_DK - DR_DK) + hk * DR_DK + i, C, K);
}

// out = base + sigmoid(h . w) x, row by row (T rows of n; h (T, n_embd), w (n_embd)): the shared
// expert's gate and its add in one launch. A block a (256 columns, row); each computes the row's dot.
extern "C" __global__ void sigmoid_gate_add(const float* base, const float* x, const float* h,
                                            const float* w, float* out, int n, int n_embd) {
    __shared__ float part[32];
    const int t = blockIdx.y, lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    float s = 0.f;
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x) s += h[(long long)t * n_embd + i] * w[i];
    s = dr_warp_sum(s);
    if (lane == 0) part[wp] = s;
    __syncthreads();
    float dot = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) dot += part[i];
    const float gate = 1.f / (1.f + expf(-dot));
    const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x, at = (long long)t * n + j;
    if (j < n) out[at] = base[at] + gate * x[at];
}

// The chunked delta rule (prefill): a block a (value head, DR_DVT columns of S), over the chunks
// of DR_BT tokens in order; the rows past T are zeros (g = beta = k = 0), which change nothing.
// Per chunk, with G = cumsum(g) and D_ij = exp(G_i - G_j) (j <= i only: above it overflows):
//   A = strictly_lower(beta_i K_i . K_j D_ij); [W | U] = (I + A)^-1 [beta exp(G) K | beta V]
//   Vn = U - W S; O = exp(G) (Q S) + tril(Q_i . K_j D_ij) Vn; S = exp(G_last) S + (K exp(G_last - G))^T Vn
// with Q already scaled. The per-head parts (A, W, the Q K^T mask) are computed by every column
// block of a head again: fp32 CUDA-core math, the state and the solve in fp32.
#define DR_KS (DR_DK + 1)          // row stride of the (BT, dk) tiles: neighbours' rows in other banks
extern "C" __global__ void delta_rule_chunked(const float* q, const float* k, const float* v,
                                              const float* g, const float* beta, float* S,
                                              float* out, int T, int Hk, int Hv, int dv, float scale) {
    DR_DYN_SMEM(smem);
    float* sS = smem;                               // (dk, DVT) the state's columns
    float* sK = sS + DR_DK * DR_DVT;                // (BT, KS)
    float* sQ = sK + DR_BT * DR_KS;                 // (BT, KS) scaled
    float* sW = sQ + DR_BT * DR_KS;                 // (BT, KS) beta exp(G) K, then W
    float* sU = sW + DR_BT * DR_KS;                 // (BT, DVT) beta V, then U, then Vn
    float* sA = sU + DR_BT * DR_DVT;                // (BT, BT) A, then the masked Q K^T
    float* sG = sA + DR_BT * DR_BT;                 // (BT) G
    float* sB = sG + DR_BT;                         // (BT) beta
    float* sEG = sB + DR_BT;                        // (BT) exp(G)
    float* sEL = sEG + DR_BT;                       // (BT) exp(G_last - G)
    const int h = blockIdx.x, hk = h / (Hv / Hk), c0 = blockIdx.y * DR_DVT, tid = threadIdx.x;
    float* Sh = S + (long long)h * DR_DK * dv;
    for (int e = tid; e < DR_DK * DR_DVT; e += DR_NT) {
        const int d = e / DR_DVT, c = e % DR_DVT;
        sS[e] = c0 + c < dv ? Sh[(long long)d * dv + c0 + c] : 0.f;
    }
    for (int t0 = 0; t0 < T; t0 += DR_BT) {
        const int n = min(DR_BT, T - t0);
        for (int e = tid; e < DR_BT * DR_DK; e += DR_NT) {
            const int t = e / DR_DK, d = e % DR_DK;
            const long long at = ((long long)(t0 + t) * Hk + hk) * DR_DK + d;
            sK[t * DR_KS + d] = t < n ? k[at] : 0.f;
            sQ[t * DR_KS + d] = t < n ? q[at] * scale : 0.f;
        }
        for (int e = tid; e < DR_BT * DR_DVT; e += DR_NT) {
            const int t = e / DR_DVT, c = e % DR_DVT;
            sU[e] = (t < n && c0 + c < dv) ? v[((long long)(t0 + t) * Hv + h) * dv + c0 + c] : 0.f;
        }
        if (tid < DR_BT) {
            sG[tid] = tid < n ? g[(long long)(t0 + tid) * Hv + h] : 0.f;
            sB[tid] = tid < n ? beta[(long long)(t0 + tid) * Hv + h] : 0.f;
        }
        __syncthreads();
        if (tid == 0)                               // in order, as NumPy's cumsum adds
            for (int t = 1; t < DR_BT; ++t) sG[t] += sG[t - 1];
        __syncthreads();
        const float G_last = sG[n - 1];
        if (tid < DR_BT) {
            sEG[tid] = expf(sG[tid]);
            sEL[tid] = tid < n ? expf(G_last - sG[tid]) : 0.f;
        }
        for (int e = tid; e < DR_BT * DR_DK; e += DR_NT) {
            const int t = e / DR_DK, d = e % DR_DK;
            sW[t * DR_KS + d] = sB[t] * expf(sG[t]) * sK[t * DR_KS + d];
        }
        for (int e = tid; e < DR_BT * DR_DVT; e += DR_NT) sU[e] *= sB[e / DR_DVT];
        for (int e = tid; e < DR_BT * DR_BT; e += DR_NT) {
            const int i = e / DR_BT, j = e % DR_BT;
            float a = 0.f;
            if (j < i) {
                float dot = 0.f;
                for (int d = 0; d < DR_DK; ++d) dot += sK[i * DR_KS + d] * sK[j * DR_KS + d];
                a = sB[i] * dot * expf(sG[i] - sG[j]);
            }
            sA[e] = a;
        }
        __syncthreads();
        // (I + A) X = [W | U] by forward substitution: a thread a column, which needs only its own
        // column's earlier rows, so no barrier between rows
        for (int col = tid; col < DR_DK + DR_DVT; col += DR_NT) {
            float* X = col < DR_DK ? sW + col : sU + (col - DR_DK);
            const int st = col < DR_DK ? DR_KS : DR_DVT;
            for (int i = 1; i < n; ++i) {
                float acc = 0.f;
                for (int j = 0; j < i; ++j) acc += sA[i * DR_BT + j] * X[j * st];
                X[i * st] -= acc;
            }
        }
        __syncthreads();
        for (int e = tid; e < DR_BT * DR_DVT; e += DR_NT) {        // Vn = U - W S
            const int t = e / DR_DVT, c = e % DR_DVT;
            float acc = 0.f;
            for (int d = 0; d < DR_DK; ++d) acc += sW[t * DR_KS + d] * sS[d * DR_DVT + c];
            sU[e] -= acc;
        }
        for (int e = tid; e < DR_BT * DR_BT; e += DR_NT) {         // the masked Q K^T (sA is free)
            const int i = e / DR_BT, j = e % DR_BT;
            float m = 0.f;
            if (j <= i) {
                float dot = 0.f;
                for (int d = 0; d < DR_DK; ++d) dot += sQ[i * DR_KS + d] * sK[j * DR_KS + d];
                m = dot * expf(sG[i] - sG[j]);
            }
            sA[e] = m;
        }
        __syncthreads();
        for (int e = tid; e < DR_BT * DR_DVT; e += DR_NT) {        // O, before S moves on
            const int t = e / DR_DVT, c = e % DR_DVT;
            if (t >= n || c0 + c >= dv) continue;
            float qs = 0.f, au = 0.f;
            for (int d = 0; d < DR_DK; ++d) qs += sQ[t * DR_KS + d] * sS[d * DR_DVT + c];
            for (int j = 0; j <= t; ++j) au += sA[t * DR_BT + j] * sU[j * DR_DVT + c];
            out[((long long)(t0 + t) * Hv + h) * dv + c0 + c] = sEG[t] * qs + au;
        }
        __syncthreads();
        const float eL = expf(G_last);
        for (int e = tid; e < DR_DK * DR_DVT; e += DR_NT) {        // S = exp(G_last) S + Kd^T Vn
            const int d = e / DR_DVT, c = e % DR_DVT;
            float acc = 0.f;
            for (int t = 0; t < n; ++t) acc += sK[t * DR_KS + d] * sEL[t] * sU[t * DR_DVT + c];
            sS[e] = eL * sS[e] + acc;
        }
        __syncthreads();                            // before the next chunk's rows replace these
    }
    for (int e = tid; e < DR_DK * DR_DVT; e += DR_NT) {
        const int d = e / DR_DVT, c = e % DR_DVT;
        if (c0 + c < dv) Sh[(long long)d * dv + c0 + c] = sS[e];
    }
}
