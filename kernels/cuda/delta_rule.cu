// The Gated DeltaNet's kernels (qwen3next's recurrent layers), launched by kernels/delta_rule.py:
// the causal depthwise conv + silu with its carried window, the L2 norm of q and k, the gates, the
// delta rule as one decode step and in its chunked form (prefill), and gated attention's
// x * sigmoid(gate). float32 throughout; the semantics are lite/backends/cpu_recurrent.py's.
//
// Set by the wrapper: DR_DK (key head dim), DR_DVT (value columns a chunked block), DR_BT (the
// chunk), DR_NT (threads a chunked block), DR_NW (warps a decode block), DR_SMEM (the chunked
// block's dynamic shared bytes).

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

// One token of the delta rule: per value head h (key head h / (Hv / Hk)), S (dk, dv) of S (Hv, dk,
// dv) in place: S = exp(g) S; d = beta (v - S^T k); S += k d^T; out = scale S^T q. A block a
// (head, 32 columns); a lane a column, the DR_NW warps each a slice of the dk rows, held in
// registers between the two passes; the warps' partial sums meet in shared memory. Fixed shapes:
// capturable in a CUDA graph.
#define DR_RPW ((DR_DK + DR_NW - 1) / DR_NW)       // rows a warp
extern "C" __global__ void delta_rule_decode(const float* q, const float* k, const float* v,
                                             const float* g, const float* beta, float* S,
                                             float* out, int Hk, int Hv, int dv, float scale) {
    __shared__ float sq[DR_DK], sk[DR_DK];
    __shared__ float red[DR_NW][32], red2[DR_NW][32];
    const int h = blockIdx.x, hk = h / (Hv / Hk);
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int col = blockIdx.y * 32 + lane;
    const bool live = col < dv;
    for (int i = threadIdx.x; i < DR_DK; i += blockDim.x) {
        sq[i] = q[(long long)hk * DR_DK + i];
        sk[i] = k[(long long)hk * DR_DK + i];
    }
    __syncthreads();
    const float decay = expf(g[h]), b = beta[h];
    float* Sh = S + (long long)h * DR_DK * dv;
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
    const float d = live ? b * (v[(long long)h * dv + col] - sk_tot) : 0.f;
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
        out[(long long)h * dv + col] = o * scale;
    }
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
            float qs = 0.f, mv = 0.f;
            for (int d = 0; d < DR_DK; ++d) qs += sQ[t * DR_KS + d] * sS[d * DR_DVT + c];
            for (int j = 0; j <= t; ++j) mv += sA[t * DR_BT + j] * sU[j * DR_DVT + c];
            out[((long long)(t0 + t) * Hv + h) * dv + c0 + c] = sEG[t] * qs + mv;
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
