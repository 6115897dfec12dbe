// The tile loop of the one-pass prefill attention (kernels/flash_attention.py says how), shared by
// the kernel over a contiguous KV cache (flash_attention.cu) and the one over the paged pool
// (flash_attention_paged.cu): they differ only in where a key's row comes from, the KV argument
// of flash_tiles, whose load(k_dst, v_dst, j, c, ok) puts 8 halves of key j from dim c of K and
// of V into shared memory (zeros where !ok). Set by the launcher: D (head dim), BM (query rows a
// CTA), BN (keys a tile), MIN_CTAS (CTAs an SM: the register cap), Q_SMEM (1: Q's fragments read
// from shared memory each tile, not held in registers), FA_SMEM (the dynamic shared bytes).

#define WARPS (BM / 16)            // a warp owns 16 query rows
#define THREADS (WARPS * 32)
#define KS (D + 8)                 // shared row stride in halves: the 8 rows an ldmatrix reads
                                   // start 16 bytes apart in bank terms, so no bank conflicts
#define NEG_INF (-__int_as_float(0x7f800000))

#include "flash_attention_ptx.cuh"

// Query rows t0 = (n_qt - 1 - qt) * BM.. (the tiles of the longest rows first) of head h, over
// q (T, H, D) f32 -> out (T, H, D) f32, causal from position p0 and within the sliding window;
// a CTA whose tile is past the chunk returns at once.
template <class KV> __device__ __forceinline__ void flash_tiles(const float* __restrict__ q,
        float* __restrict__ out, const KV& kv, int T, int H, int h, int qt, int p0, int window,
        float scale_log2) {
    FA_DYN_SMEM(smem);
    __half* Ks = (__half*)smem;                        // 2 stages x BN x KS
    __half* Vs = Ks + 2 * BN * KS;                     // 2 stages x BN x KS
    const int n_qt = (T + BM - 1) / BM;
    if (qt >= n_qt) return;                            // a shorter chunk than the grid's longest
    const int t0 = (n_qt - 1 - qt) * BM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tg = lane & 3;            // accumulator row and column pair
    const int mi = lane >> 3, mr = lane & 7;           // ldmatrix: which 8x8 matrix, which row
    const int S = p0 + T;
    const int r0 = t0 + warp * 16 + g, r1 = r0 + 8;    // this thread's two query rows
    const int qp0 = p0 + r0, qp1 = p0 + r1;            // and their positions

#if Q_SMEM
    // Q (BM x D, fp16) in shared memory, its A fragments read by ldmatrix for each tile's S: at
    // D = 256 they would take 64 registers beside O's 128 (FlashAttention-2 keeps Q there too)
    __half* Qs = Vs + 2 * BN * KS;                     // BM x KS
    for (int i = tid; i < BM * D / 2; i += THREADS) {
        const int r = i / (D / 2), c = (i % (D / 2)) * 2, t = t0 + r;
        float2 x = make_float2(0.f, 0.f);              // rows past the chunk: zeros
        if (t < T) x = *reinterpret_cast<const float2*>(q + ((long long)t * H + h) * D + c);
        *reinterpret_cast<unsigned*>(Qs + r * KS + c) = pack_half2(x.x, x.y);
    }                                                  // (visible after the loop's first barrier)
#else
    // Q as A fragments (fp16), the whole kernel long: regs {row g, k 2tg..}, {g+8, 2tg..},
    // {g, 2tg+8..}, {g+8, 2tg+8..} of each 16-wide slice of D
    unsigned qa[D / 16][4];
    {
        const float* q0 = q + ((long long)r0 * H + h) * D + 2 * tg;
        const float* q1 = q + ((long long)r1 * H + h) * D + 2 * tg;
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const int c = kk * 16;
            qa[kk][0] = r0 < T ? pack_half2(q0[c], q0[c + 1]) : 0u;
            qa[kk][1] = r1 < T ? pack_half2(q1[c], q1[c + 1]) : 0u;
            qa[kk][2] = r0 < T ? pack_half2(q0[c + 8], q0[c + 9]) : 0u;
            qa[kk][3] = r1 < T ? pack_half2(q1[c + 8], q1[c + 9]) : 0u;
        }
    }
#endif
    float o[D / 8][4];
    #pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;   // row max (scaled) and partial sums

    // keys this CTA needs: up to its last row's position (causal), from its first row's window
    const int first_qp = p0 + t0, last_qp = p0 + min(T, t0 + BM) - 1;
    int k_begin = window > 0 ? max(0, first_qp - window + 1) : 0;
    k_begin -= k_begin % BN;
    const int n_tiles = (last_qp + 1 - k_begin + BN - 1) / BN;

    auto load_tile = [&](int stage, int kt) {
        __half* ks = Ks + stage * BN * KS;
        __half* vs = Vs + stage * BN * KS;
        #pragma unroll
        for (int u = 0; u < BN * D / 8 / THREADS; ++u) {    // 16-byte pieces
            const int i = tid + u * THREADS, r = i / (D / 8), c = (i % (D / 8)) * 8;
            const int j = kt + r;
            kv.load(ks + r * KS + c, vs + r * KS + c, j, c, j < S);   // past the chunk: zeros
        }
    };

    load_tile(0, k_begin);
    cp_async_commit();
    for (int it = 0; it < n_tiles; ++it) {
        const int kt = k_begin + it * BN;
        if (it + 1 < n_tiles) load_tile((it + 1) & 1, kt + BN);
        cp_async_commit();                             // maybe empty: keeps wait_group 1 right
        cp_async_wait_1();                             // this tile has landed (for this thread)
        __syncthreads();                               // ... and for all threads
        const __half* ks = Ks + (it & 1) * BN * KS;
        const __half* vs = Vs + (it & 1) * BN * KS;

        // S (16 x BN) = Q K^T. ldmatrix x4 matrices: (keys +0, dims +0), (keys +0, dims +8),
        // (keys +8, dims +0), (keys +8, dims +8): b0, b1 of two 8-key slices
        float s[BN / 8][4];
        #pragma unroll
        for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#if Q_SMEM
            // matrices (rows +0, dims +0), (rows +8, dims +0), (rows +0, dims +8), (rows +8, dims +8)
            unsigned qk[4];
            ldmatrix_x4(qk, Qs + (warp * 16 + (mi & 1) * 8 + mr) * KS + kk * 16 + (mi >> 1) * 8);
#else
            const unsigned* qk = qa[kk];
#endif
            #pragma unroll
            for (int np = 0; np < BN / 16; ++np) {
                unsigned b[4];
                ldmatrix_x4(b, ks + (np * 16 + (mi >> 1) * 8 + mr) * KS + kk * 16 + (mi & 1) * 8);
                mma_16816(s[2 * np], qk, b[0], b[1]);
                mma_16816(s[2 * np + 1], qk, b[2], b[3]);
            }
        }

        // mask only tiles that cross the causal diagonal or the window's edge
        const bool edge = kt + BN - 1 > first_qp || (window > 0 && last_qp - kt >= window);
        #pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[n][e] * scale_log2;
                if (edge) {
                    const int j = kt + n * 8 + 2 * tg + (e & 1);
                    const int qp = e < 2 ? qp0 : qp1;
                    if (j > qp || (window > 0 && qp - j >= window)) x = NEG_INF;
                }
                s[n][e] = x;
            }
        }

        // online softmax: new row max over this tile (a row lives in one quad of threads)
        float mx0 = m0, mx1 = m1;
        #pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
            mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
            mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, 2));
        // a row with every key so far masked keeps max -inf: subtract 0 then (exp2(-inf) = 0)
        const float base0 = mx0 == NEG_INF ? 0.f : mx0, base1 = mx1 == NEG_INF ? 0.f : mx1;
        const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
        m0 = mx0;
        m1 = mx1;
        l0 *= alpha0;
        l1 *= alpha1;
        #pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= alpha0; o[n][1] *= alpha0;
            o[n][2] *= alpha1; o[n][3] *= alpha1;
        }
        #pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
            s[n][0] = exp2f(s[n][0] - base0); s[n][1] = exp2f(s[n][1] - base0);
            s[n][2] = exp2f(s[n][2] - base1); s[n][3] = exp2f(s[n][3] - base1);
            l0 += s[n][0] + s[n][1];
            l1 += s[n][2] + s[n][3];
        }

        // O (16 x D) += P V. P's A fragment for keys 16kk.. is the S accumulators of slices 2kk
        // and 2kk+1; ldmatrix.trans matrices: (keys +0, dims +0), (keys +8, dims +0),
        // (keys +0, dims +8), (keys +8, dims +8): b0, b1 of two 8-dim slices
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            unsigned pa[4];
            pa[0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            #pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                unsigned b[4];
                ldmatrix_x4_trans(b, vs + (kk * 16 + (mi & 1) * 8 + mr) * KS + dp * 16 + (mi >> 1) * 8);
                mma_16816(o[2 * dp], pa, b[0], b[1]);
                mma_16816(o[2 * dp + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads();                               // all done with this stage: refillable
    }

    l0 += __shfl_xor_sync(0xffffffff, l0, 1);
    l0 += __shfl_xor_sync(0xffffffff, l0, 2);
    l1 += __shfl_xor_sync(0xffffffff, l1, 1);
    l1 += __shfl_xor_sync(0xffffffff, l1, 2);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    float* o0 = out + ((long long)r0 * H + h) * D + 2 * tg;
    float* o1 = out + ((long long)r1 * H + h) * D + 2 * tg;
    #pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        if (r0 < T) *reinterpret_cast<float2*>(o0 + n * 8) = make_float2(o[n][0] * inv0, o[n][1] * inv0);
        if (r1 < T) *reinterpret_cast<float2*>(o1 + n * 8) = make_float2(o[n][2] * inv1, o[n][3] * inv1);
    }
}
