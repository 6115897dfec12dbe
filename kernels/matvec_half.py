"""`mvh`: the decode matvec (n = 1, 2) for Q4_K and Q6_K with the products in half2 (CUDA C).

Run on the H200 in session 3 (BENCHMARKS): its GPU tests passed, and it was not faster than the
register kernel (2.9 instructions a weight against 4.7 for Q4_K, yet slower): kept opt-in. The CUDA C
also runs on the host through tests/cuda_c_emulator.py (tests/test_kernels_matvec_half.py, against
float64). Opt-in through matvec_cuda.launch(config=("mvh", rows a CTA)) or
("mvh", rows, 64) (Q4_K, 64-weight chunks); `python3 tests/gpu_sweep_matvec.py --types Q4_K,Q6_K
--variants mvh8,mvh4,mvh8c64,mvh4c64` times it beside the register kernel `mv`.

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
  - x is converted once a chunk (32 or 64 values) and reused for the R rows of the CTA. It is
    scaled by a power of two per chunk so that max |x| lands in [8, 16): partial sums stay at or
    below 2^15 (no fp16 overflow for any x, activation outliers included) and small x keep 11
    significant bits. Exact: the scale is undone in fp32.
  - Chunks: 32 weights a thread and loop trip, as `mv` (HQ4_K, HQ6_K), or for Q4_K 64 (HQ4_K64:
    a whole sub-block pair, so the scale and minimum decode, ~40 instructions a row and chunk,
    serves twice the weights, for twice the x registers).
  - Q4_K's minimum and the centring (q - 8 instead of q) use fp32 sums of x per run, as `mv`.
Error: fp16 has 11 significant bits (unit roundoff u = 2^-11). A run of k HFMA2 on values |q'| <= 8
(Q4_K) and x rounded once adds at most (k + 1) u sum |q' x| a run, worst case ~4e-3 of that sum,
typically a few u at most; summing runs in fp32 averages further (emulated: at most 1e-3 of
sum |x q'| d sc per output, rms error 2e-4 to 6e-4 of the rms result; the test has the bound).
Instructions in the loop a weight (SASS of NVRTC 13 for sm_90, n = 1; the register kernel `mv`
in brackets): Q4_K 3.5 with 8 rows a CTA, 4.1 with 4 [4.7 at 8]; HQ4_K64 2.9 with 8, 3.4 with 4;
Q6_K 5.1 with 8, 5.7 with 4 [6.0 at 4]. Registers: HQ4_K 78 (8 rows), HQ4_K64 148 (8) / 122 (4),
HQ6_K 119 (4) [mv 96]. What is left a weight: 1.6 in the pairs (SHF, LOP3, HSUB2, HFMA2 per 8
weights: 1 + 4 + 4 + 4), the rest per row and chunk (scale decode, loads) and per chunk (x to
half2: max, scale, convert). Q6_K gains little: its 2-byte-aligned blocks take 13 word loads and
~20 address instructions a row and chunk, and the 6-bit values cost 3 instructions per 4 before
pairing.
Same grid (rows / R CTAs of 128 threads) and launch arguments as `mv`; with 32-weight chunks also
the same loads (the Raw, load and xoff of matvec_cuda's TQ4_K / TQ6_K); Q4_K blocks are read with
16-byte loads either way.
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
__device__ __forceinline__ unsigned lt_hadd2(unsigned a, unsigned b) {
    unsigned d; asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
__device__ __forceinline__ unsigned lt_f2h2(float lo, float hi) {   // cvt packs its first source high
    unsigned d; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d; }
// (a & m) | c as ONE LOP3: written in C, ptxas emits two (an instruction takes one immediate).
template <unsigned M, unsigned C> __device__ __forceinline__ unsigned lt_andor(unsigned a) {
    unsigned d; asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(M), "n"(C)); return d; }
#else
template <unsigned M, unsigned C> inline unsigned lt_andor(unsigned a) { return (a & M) | C; }
inline unsigned lt_hfma2(unsigned a, unsigned b, unsigned c) { return lt_host_hfma2(a, b, c); }
inline unsigned lt_hsub2(unsigned a, unsigned b) { return lt_host_hsub2(a, b); }
inline unsigned lt_hadd2(unsigned a, unsigned b) { return lt_host_hadd2(a, b); }
inline unsigned lt_f2h2(float lo, float hi) { return lt_host_f2h2(lo, hi); }
#endif
// The two halves of a half2 partial sum, added in fp32.
__device__ __forceinline__ float lt_hsum(unsigned h) {
    return lt_h2f((unsigned short)(h & 0xFFFFu)) + lt_h2f((unsigned short)(h >> 16)); }

// Each struct: the chunk geometry (BE, TS, CPB, Raw, load, xoff; XV float4 of x a chunk, the
// first and last XV/2 summed into xa, xb) and dot() of one row's chunk. x pairs (xh): pair 2k =
// elements 0 and 2 of float4 k of x, pair 2k+1 = elements 1 and 3 (what both value unpackings
// below make of bytes 0, 2 and 1, 3 of a word).
// Q4_K values q of 4 words (16 bytes: low nibbles run a, x pairs xa_[0..7]; high nibbles run b,
// pairs xb_[0..7]) into half2 partial sums, 8 products a lane: q - 8, and 16 (q - 8) for run b.
__device__ __forceinline__ void lt_q4_runs(const unsigned (&q)[4], const unsigned* xa_, const unsigned* xb_,
                                           unsigned& ha, unsigned& hb) {
    ha = 0u; hb = 0u;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        const unsigned u = q[k] >> 8;
        ha = lt_hfma2(lt_hsub2(lt_andor<0x000F000Fu, 0x64006400u>(q[k]), 0x64086408u), xa_[2 * k], ha);
        ha = lt_hfma2(lt_hsub2(lt_andor<0x000F000Fu, 0x64006400u>(u), 0x64086408u), xa_[2 * k + 1], ha);
        hb = lt_hfma2(lt_hsub2(lt_andor<0x00F000F0u, 0x64006400u>(q[k]), 0x64806480u), xb_[2 * k], hb);
        hb = lt_hfma2(lt_hsub2(lt_andor<0x00F000F0u, 0x64006400u>(u), 0x64806480u), xb_[2 * k + 1], hb);
    }
}

struct HQ4_K {   // `mv`'s chunks (TQ4_K): 32 weights, 16 of sub-block 2j and 16 of 2j+1
    using T = TQ4_K;
    static constexpr int BE = T::BE, TS = T::TS, CPB = T::CPB, XV = 8;
    using Raw = T::Raw;
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        T::load<SH>(r, row, c); }
    __device__ static __forceinline__ int xoff(int c, int k) { return T::xoff(c, k); }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const unsigned (&xh)[2 * XV],
                                                float inv, float xa, float xb) {
        const unsigned q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        unsigned ha, hb;
        lt_q4_runs(q, xh, xh + 8, ha, hb);
        // sum q x = sum (q - 8) x + 8 sum x, back in x's units
        const float sa = fmaf(lt_hsum(ha), inv, 8.f * xa), sb = fmaf(lt_hsum(hb), inv * 0.0625f, 8.f * xb);
        return kblock_scales(r.h, (c & 7) >> 1, sa, sb, xa, xb);
    }
};

struct HQ4_K64 {   // chunks of 64 weights: sub-blocks 2j and 2j+1 whole (qs bytes 32j..32j+31), so
    static constexpr int BE = 256, TS = 144, CPB = 4, XV = 16;   // the scale decode of kblock_scales
    struct Raw { uint4 h, q0, q1; };                             // serves 64 weights, not 32
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* b = row + (c >> 2) * TS;
        r.h = ld16<SH>(b);
        r.q0 = ld16<SH>(b + 16 + 32 * (c & 3));
        r.q1 = ld16<SH>(b + 32 + 32 * (c & 3));
    }
    __device__ static __forceinline__ int xoff(int c, int k) { return (c >> 2) * 256 + 64 * (c & 3) + 4 * k; }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const unsigned (&xh)[2 * XV],
                                                float inv, float xa, float xb) {
        // byte i of qs[32j..]: low nibble element 64j + i (run a, float4 i/4), high 64j + 32 + i
        const unsigned q0[4] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w}, q1[4] = {r.q1.x, r.q1.y, r.q1.z, r.q1.w};
        unsigned ha0, hb0, ha1, hb1;
        lt_q4_runs(q0, xh, xh + 16, ha0, hb0);
        lt_q4_runs(q1, xh + 8, xh + 24, ha1, hb1);
        // two 8-product sums a lane added in fp16 (one more rounding), then fp32 as HQ4_K
        const float sa = fmaf(lt_hsum(lt_hadd2(ha0, ha1)), inv, 8.f * xa);
        const float sb = fmaf(lt_hsum(lt_hadd2(hb0, hb1)), inv * 0.0625f, 8.f * xb);
        return kblock_scales(r.h, c & 3, sa, sb, xa, xb);
    }
};

struct HQ6_K {   // `mv`'s chunks (TQ6_K): 32 weights, 4 runs of 8
    using T = TQ6_K;
    static constexpr int BE = T::BE, TS = T::TS, CPB = T::CPB, XV = 8;
    using Raw = T::Raw;
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        T::load<SH>(r, row, c); }
    __device__ static __forceinline__ int xoff(int c, int k) { return T::xoff(c, k); }
    // Run of 8 values (6-bit bytes in v0, v1) against pairs xh[0..3]: 4 products a lane.
    __device__ static __forceinline__ float run(unsigned v0, unsigned v1, const unsigned* xh) {
        unsigned h = lt_hfma2(lt_hsub2(__byte_perm(v0, 0x64646464u, 0x4240u), 0x64206420u), xh[0], 0u);
        h = lt_hfma2(lt_hsub2(__byte_perm(v0, 0x64646464u, 0x4341u), 0x64206420u), xh[1], h);
        h = lt_hfma2(lt_hsub2(__byte_perm(v1, 0x64646464u, 0x4240u), 0x64206420u), xh[2], h);
        h = lt_hfma2(lt_hsub2(__byte_perm(v1, 0x64646464u, 0x4341u), 0x64206420u), xh[3], h);
        return lt_hsum(h);
    }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const unsigned (&xh)[2 * XV],
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
    constexpr int XV = H::XV;
    const int row0 = blockIdx.x * R, nb = cols / H::BE, chunks = nb * H::CPB;
    const long long rb = (long long)nb * H::TS;
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
        typename H::Raw cur[R];
        #pragma unroll
        for (int r = 0; r < R; r++) H::load(cur[r], rowp[r], c);
        #pragma unroll
        for (int n = 0; n < N; n++) {
            const float* xr = x + (long long)n * cols;
            float4 xv[XV];
            #pragma unroll
            for (int k = 0; k < XV; k++) xv[k] = __ldg((const float4*)(xr + H::xoff(c, k)));
            float xa = 0.f, xb = 0.f, m = 0.f;   // fp32 sums of the two halves (runs a, b); max |x|
            #pragma unroll
            for (int k = 0; k < XV; k++) {
                const float t = (xv[k].x + xv[k].y) + (xv[k].z + xv[k].w);
                if (k < XV / 2) xa += t; else xb += t;
                m = fmaxf(m, fmaxf(fmaxf(fabsf(xv[k].x), fabsf(xv[k].y)), fmaxf(fabsf(xv[k].z), fabsf(xv[k].w))));
            }
            // s = 2^(3 - E) for max |x| = 1.f * 2^E: scaled max in [8, 16), so that no partial sum
            // (<= 16 * 8 * 16 * 8 = 2^14, two of them added: 2^15) overflows fp16. Biased exponent
            // clamped to >= 4 so that s and 1/s stay normal (all-zero x: s = 2^126, products 0).
            const int eb = max(__float_as_int(m) >> 23, 4);
            const float s = __int_as_float((257 - eb) << 23), inv = __int_as_float((eb - 3) << 23);
            unsigned xh[2 * XV];
            #pragma unroll
            for (int k = 0; k < XV; k++) {
                xh[2 * k] = lt_f2h2(xv[k].x * s, xv[k].z * s);
                xh[2 * k + 1] = lt_f2h2(xv[k].y * s, xv[k].w * s);
            }
            #pragma unroll
            for (int r = 0; r < R; r++) acc[r][n] += H::dot(cur[r], c, xh, inv, xa, xb);
        }
    }
    __shared__ float red[4][R * N];
    const float total = block_sum<R, N>(acc, red);       // as `mv`
    if (threadIdx.x < R * N) {
        const int r = threadIdx.x / N, n = threadIdx.x % N;
        if (row0 + r < rows) out[(long long)n * rows + row0 + r] = total;
    }
}
"""


# weights a chunk (a thread's share of a row per loop trip) per type: 32 as `mv`, or 64 (Q4_K only)
CHUNKS = {"Q4_K": (32, 64), "Q6_K": (32,)}


def supports(qtype, config):
    """config: ("mvh", rows a CTA[, weights a chunk])."""
    return qtype in CHUNKS and (len(config) < 3 or config[2] in CHUNKS[qtype])


def kernel_name(qtype, n, rows_per_cta, chunk=32):
    return f"mvh<HQ{qtype[1:]}{'' if chunk == 32 else chunk}, {n}, {rows_per_cta}>"
