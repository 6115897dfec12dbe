"""`mvh`: the decode matvec (n = 1, 2) for Q4_K and Q6_K with the products in half2 (CUDA C).

NOT YET RUN ON A GPU. Written in a session without GPU time: the CUDA C compiles with nvcc
(sm_90) and runs on the host through tests/cuda_c_emulator.py (tests/test_kernels_matvec_half.py,
against float64), nothing more. Opt-in through matvec_cuda.launch(config=("mvh", rows a CTA));
tests/gpu_sweep_matvec.py times it beside the register kernel `mv`.

Why: `mv` (kernels/matvec_cuda.py) is bound by instructions, ~4.7 a weight for Q4_K (byte to
float, subtract the zero point, FMA, all fp32, one weight at a time). Here two weights share each
instruction:
  - Quant values become fp16 pairs by the exponent trick: a nibble OR-ed into 0x6400 (fp16 1024)
    reads as 1024 + q; one HSUB2 of 1024 + zero point leaves q - 8 (Q4_K) or q - 32 (Q6_K),
    exactly. Q4_K: one LOP3 makes a pair from bytes 0 and 2 of a word (mask 0x000F000F), the high
    nibbles are taken in place (mask 0x00F000F0: 16 (q - 8), the 16 folded into the fp32 scale),
    bytes 1 and 3 after one shift. Q6_K: the 6-bit bytes are built as in `mv`, then one PRMT
    puts two of them under 0x64 bytes.
  - One HFMA2 multiplies-adds a pair against x held as half2. A half2 partial sum covers one
    sub-block run (Q4_K: 8 products a lane, Q6_K: 4), then goes to fp32; from there on (sub-block
    scales, d, dmin, the sum over the row) everything is fp32 as in `mv`.
  - x is converted once a chunk (32 values) and reused for the R rows of the CTA. It is scaled by
    a power of two per chunk so that max |x| lands in [16, 32): partial sums stay below 2^15 (no
    fp16 overflow for any x, activation outliers included) and small x keep 11 significant bits.
    Exact: the scale is undone in fp32.
  - Q4_K's minimum and the centring (q - 8 instead of q) use fp32 sums of x per run, as `mv`.
Error: fp16 has 11 significant bits (unit roundoff u = 2^-11). A run of k HFMA2 on values |q'| <= 8
(Q4_K) and x rounded once adds at most (k + 1) u sum |q' x| a run, worst case ~4e-3 of that sum,
typically ~u sqrt(k) ~ 1e-3 of it; summing runs in fp32 averages further.
Same grid (rows / R CTAs of 128 threads), chunks and loads as `mv` (the Raw, load and xoff of
matvec_cuda's TQ4_K / TQ6_K; Q4_K blocks with 16-byte loads), and the same launch arguments.
"""

TYPES = ("Q4_K", "Q6_K")

C_HALF = r"""
// half2 arithmetic on 32-bit registers (low half: the first of the pair), as PTX so that no
// fp16 header is needed; tests/cuda_c_emulator.py has host versions (LITE_HOST_SHIM).
#ifndef LITE_HOST_SHIM
__device__ __forceinline__ unsigned lt_hfma2(unsigned a, unsigned b, unsigned c) {
    unsigned d; asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d; }
__device__ __forceinline__ unsigned lt_hsub2(unsigned a, unsigned b) {
    unsigned d; asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
__device__ __forceinline__ unsigned lt_f2h2(float lo, float hi) {   // cvt packs its first source high
    unsigned d; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d; }
// (a & m) | c as ONE LOP3: written in C, ptxas emits two (an instruction takes one immediate).
template <unsigned M, unsigned C> __device__ __forceinline__ unsigned lt_andor(unsigned a) {
    unsigned d; asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(M), "n"(C)); return d; }
#else
template <unsigned M, unsigned C> inline unsigned lt_andor(unsigned a) { return (a & M) | C; }
inline unsigned lt_hfma2(unsigned a, unsigned b, unsigned c) { return lt_host_hfma2(a, b, c); }
inline unsigned lt_hsub2(unsigned a, unsigned b) { return lt_host_hsub2(a, b); }
inline unsigned lt_f2h2(float lo, float hi) { return lt_host_f2h2(lo, hi); }
#endif
// The two halves of a half2 partial sum, added in fp32.
__device__ __forceinline__ float lt_hsum(unsigned h) {
    return lt_h2f((unsigned short)(h & 0xFFFFu)) + lt_h2f((unsigned short)(h >> 16)); }

// x pairs (xh): pair 2k = elements 0 and 2 of float4 k of `mv`'s xv, pair 2k+1 = elements 1 and
// 3 (what both value unpackings below produce from bytes 0, 2 and 1, 3 of a word).
struct HQ4_K {
    using T = TQ4_K;
    __device__ static __forceinline__ float dot(const T::Raw& r, int c, const unsigned (&xh)[16],
                                                float inv, float xa, float xb) {
        const unsigned q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        unsigned ha = 0u, hb = 0u;     // lanes: the 8 even / 8 odd elements of runs a (low nibbles), b (high)
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            const unsigned u = q[k] >> 8;
            ha = lt_hfma2(lt_hsub2(lt_andor<0x000F000Fu, 0x64006400u>(q[k]), 0x64086408u), xh[2 * k], ha);
            ha = lt_hfma2(lt_hsub2(lt_andor<0x000F000Fu, 0x64006400u>(u), 0x64086408u), xh[2 * k + 1], ha);
            hb = lt_hfma2(lt_hsub2(lt_andor<0x00F000F0u, 0x64006400u>(q[k]), 0x64806480u), xh[8 + 2 * k], hb);
            hb = lt_hfma2(lt_hsub2(lt_andor<0x00F000F0u, 0x64006400u>(u), 0x64806480u), xh[8 + 2 * k + 1], hb);
        }
        // sum q x = sum (q - 8) x + 8 sum x, back in x's units
        const float sa = fmaf(lt_hsum(ha), inv, 8.f * xa), sb = fmaf(lt_hsum(hb), inv * 0.0625f, 8.f * xb);
        return kblock_scales(r.h, (c & 7) >> 1, sa, sb, xa, xb);
    }
};

struct HQ6_K {
    using T = TQ6_K;
    // Run of 8 values (6-bit bytes in v0, v1) against pairs xh[0..3]: 4 products a lane.
    __device__ static __forceinline__ float run(unsigned v0, unsigned v1, const unsigned* xh) {
        unsigned h = lt_hfma2(lt_hsub2(__byte_perm(v0, 0x64646464u, 0x4240u), 0x64206420u), xh[0], 0u);
        h = lt_hfma2(lt_hsub2(__byte_perm(v0, 0x64646464u, 0x4341u), 0x64206420u), xh[1], h);
        h = lt_hfma2(lt_hsub2(__byte_perm(v1, 0x64646464u, 0x4240u), 0x64206420u), xh[2], h);
        h = lt_hfma2(lt_hsub2(__byte_perm(v1, 0x64646464u, 0x4341u), 0x64206420u), xh[3], h);
        return lt_hsum(h);
    }
    __device__ static __forceinline__ float dot(const T::Raw& r, int c, const unsigned (&xh)[16],
                                                float inv, float, float) {
        // as TQ6_K::dot (kernels/matvec_cuda.py): re-aligned words, then 6-bit values of run t
        const unsigned a0 = __funnelshift_r(r.a[0], r.a[1], r.sh), a1 = __funnelshift_r(r.a[1], r.a[2], r.sh);
        const unsigned b0 = __funnelshift_r(r.b[0], r.b[1], r.sh), b1 = __funnelshift_r(r.b[1], r.b[2], r.sh);
        const unsigned h0 = __funnelshift_r(r.h[0], r.h[1], r.sh), h1 = __funnelshift_r(r.h[1], r.h[2], r.sh);
        const unsigned s0 = __funnelshift_r(r.s[0], r.s[1], r.sh) ^ 0x80808080u;
        const unsigned s1 = __funnelshift_r(r.s[1], r.s[2], r.sh) ^ 0x80808080u;
        const int e = (c & 2) >> 1;
        const float t0 = run((a0 & LO4) | ((h0 << 4) & 0x30303030u), (a1 & LO4) | ((h1 << 4) & 0x30303030u), xh);
        const float t1 = run((b0 & LO4) | ((h0 << 2) & 0x30303030u), (b1 & LO4) | ((h1 << 2) & 0x30303030u), xh + 4);
        const float t2 = run(((a0 >> 4) & LO4) | (h0 & 0x30303030u), ((a1 >> 4) & LO4) | (h1 & 0x30303030u), xh + 8);
        const float t3 = run(((b0 >> 4) & LO4) | ((h0 >> 2) & 0x30303030u), ((b1 >> 4) & LO4) | ((h1 >> 2) & 0x30303030u), xh + 12);
        const float s = BF(s0, e, 128.f) * t0 + BF(s0, e + 2, 128.f) * t1 + BF(s1, e, 128.f) * t2 + BF(s1, e + 2, 128.f) * t3;
        return (lt_h2f(r.d) * inv) * s;
    }
};

// `mv` (prefetch 0) with x as scaled half2 pairs; out (N, rows) = x (N, cols) @ W.T.
template <class H, int N, int R>
__global__ void __launch_bounds__(128) mvh(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                           float* __restrict__ out, int rows, int cols) {
    using T = typename H::T;
    const int row0 = blockIdx.x * R, nb = cols / T::BE, chunks = nb * T::CPB;
    const long long rb = (long long)nb * T::TS;
    const unsigned char* rowp[R];
    #pragma unroll
    for (int r = 0; r < R; r++)   // rows past the end re-read the last row and are not written
        rowp[r] = w + (long long)min(row0 + r, rows - 1) * rb;
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
            const float* xr = x + (long long)n * cols;
            float4 xv[8];
            #pragma unroll
            for (int k = 0; k < 8; k++) xv[k] = __ldg((const float4*)(xr + T::xoff(c, k)));
            const float xa = (xv[0].x + xv[0].y + xv[0].z + xv[0].w) + (xv[1].x + xv[1].y + xv[1].z + xv[1].w)
                           + (xv[2].x + xv[2].y + xv[2].z + xv[2].w) + (xv[3].x + xv[3].y + xv[3].z + xv[3].w);
            const float xb = (xv[4].x + xv[4].y + xv[4].z + xv[4].w) + (xv[5].x + xv[5].y + xv[5].z + xv[5].w)
                           + (xv[6].x + xv[6].y + xv[6].z + xv[6].w) + (xv[7].x + xv[7].y + xv[7].z + xv[7].w);
            // s = 2^(4 - E) for max |x| = 1.f * 2^E: scaled max in [16, 32). Biased exponent clamped
            // to >= 5 so that s and 1/s stay normal (all-zero x: s = 2^126, products 0).
            float m = 0.f;
            #pragma unroll
            for (int k = 0; k < 8; k++)
                m = fmaxf(m, fmaxf(fmaxf(fabsf(xv[k].x), fabsf(xv[k].y)), fmaxf(fabsf(xv[k].z), fabsf(xv[k].w))));
            const int eb = max(__float_as_int(m) >> 23, 5);
            const float s = __int_as_float((258 - eb) << 23), inv = __int_as_float((eb - 4) << 23);
            unsigned xh[16];
            #pragma unroll
            for (int k = 0; k < 8; k++) {
                xh[2 * k] = lt_f2h2(xv[k].x * s, xv[k].z * s);
                xh[2 * k + 1] = lt_f2h2(xv[k].y * s, xv[k].w * s);
            }
            #pragma unroll
            for (int r = 0; r < R; r++) acc[r][n] += H::dot(cur[r], c, xh, inv, xa, xb);
        }
    }
    // warp sums, then the 4 warps' partials through shared memory (as `mv`)
    __shared__ float red[4][R * N];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float v = acc[r][n];
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) red[warp][r * N + n] = v;
        }
    __syncthreads();
    if (threadIdx.x < R * N) {
        const int r = threadIdx.x / N, n = threadIdx.x % N;
        if (row0 + r < rows)
            out[(long long)n * rows + row0 + r] = (red[0][threadIdx.x] + red[1][threadIdx.x])
                                                  + (red[2][threadIdx.x] + red[3][threadIdx.x]);
    }
}
"""


def kernel_name(qtype, n, rows_per_cta):
    return f"mvh<HQ{qtype[1:]}, {n}, {rows_per_cta}>"
