"""Fused dequantize-and-dot (decode matvec) for Q4_0, Q8_0, Q4_K, Q5_K and Q6_K in CUDA C (CuPy RawModule).

out (n, rows) f32 = x (n, cols) f32 @ W.T, W (rows, cols) as GGUF blocks, fp32 accumulation, x in fp32.
This is the GPU path of kernels/matvec_basic.py (which dispatches here on a GPU when the inputs are
aligned); the Numba kernels there stay the CI-checked twin (same products, checked against each other
on the GPU). Why it is shaped this way (the Numba kernels reached 10-24% of copy bandwidth, bound by
instructions, not memory):
  - A CTA of 4 warps owns R rows; its 128 threads split each row into *chunks* of 32 weights (lanes of
    a warp take consecutive chunks, so weight loads coalesce). A thread loads the x of its chunk once
    (8 float4) and reuses it for all R rows: x is 32 bits a weight against 4.5-8.5, so without reuse
    x traffic through L1 would exceed the weight traffic several times over.
  - The R chunk loads of a loop trip are issued together (R independent 16-32 byte loads in flight
    a thread); with prefetch (P=1) the next trip's are issued before this trip's are used. Q4_K/Q5_K blocks (144/176 bytes) are 16-byte aligned
    and read with 16-byte loads; Q4_0 (18), Q8_0 (34) and Q6_K (210) blocks start at 2 mod 4 bytes
    half the time, so they are read as aligned 32-bit words and re-aligned with funnel shifts.
  - A chunk never straddles a sub-block boundary, so its scales decode once per 16-32 weights.
  - Quant bytes become floats by the exponent trick: PRMT places byte b under 0x4B000000 (= 2^23 + b
    exactly) and one FADD removes 2^23 plus the type's zero point (8, 32, 128): exact, 2 instructions,
    avoiding the quarter-rate int->float unit. Q4_K/Q5_K minimums use per-run sums of x.
  - Templated on n (1..C_MAX_N; larger n in chunks) so accumulators stay in registers; per n the
    weights are re-decoded from registers rather than keeping 32 floats of x per n alive.
"""
import contextlib
import functools

import numpy as np

from lite.kernels import pdl as pdl_mod
from lite.kernels.matvec_structs import C_TYPES, FAST_DOT  # noqa: F401  (C_TYPES: other modules read it here)
from lite.kernels.pdl import C_PDL

C_MAX_N = 8
THREADS = 128
# (rows a CTA, prefetch 0/1) per type: the fastest at the decode shapes (BENCHMARKS.md); 16 rows a
# CTA lost everywhere.
CONFIG = {"Q4_0": (8, 1), "Q8_0": (8, 1), "Q4_K": (8, 0), "Q5_K": (4, 0), "Q6_K": (4, 0)}
# The types whose decode products can quantize x and run on dp4a (kernels/matvec_q8.py): the default
# of BackendConfig.int8_dot_types and of every `int8_dot_types` argument of the kernels.
INT8_DOT_TYPES = ("Q4_K", "Q6_K", "IQ3_XXS")
# The types whose register kernel takes the two-instruction dot (T<type>H, kernels/matvec_structs.py)
# for n <= 2, in every decode product of the type (decode_struct: the epilogue kernels, the MoE experts).

# Byte alignment the kernel needs of the block buffer (16-byte loads vs 32-bit word loads).
ALIGN = {"Q4_0": 4, "Q8_0": 4, "Q4_K": 16, "Q5_K": 16, "Q6_K": 4}

# C_PDL first: C_KERNEL's PDL_PROLOGUE (kernels/pdl.py; empty unless LT_PDL is defined).
C_HEAD = C_PDL + r"""
#ifndef LITE_HOST_SHIM
__device__ __forceinline__ float lt_h2f(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
#endif
// Byte j of w as an exact float, minus `off`: 0x4B0000bb reads as 2^23 + bb.
#define BF(w, j, off) (__int_as_float(__byte_perm((w), 0x4B000000u, 0x7440u | (j))) - (8388608.f + (off)))
#define LO4 0x0F0F0F0Fu
// Loads of block bytes: from global memory through the read-only path, or (SH, the staged
// kernel of matvec_staged.py) from a stage in shared memory.
template <bool SH> __device__ __forceinline__ unsigned ldw(const unsigned char* p) {
    if constexpr (SH) return *(const unsigned*)p; else return __ldg((const unsigned*)p); }
template <bool SH> __device__ __forceinline__ uint4 ld16(const unsigned char* p) {
    if constexpr (SH) return *(const uint4*)p; else return __ldg((const uint4*)p); }
template <bool SH> __device__ __forceinline__ unsigned short ldh(const unsigned char* p) {
    if constexpr (SH) return *(const unsigned short*)p; else return __ldg((const unsigned short*)p); }
// Sum of 16 weights (4 words of 4 bytes, zero point off) times 4 float4 of x.
__device__ __forceinline__ float dot16(unsigned a, unsigned b, unsigned c, unsigned d, const float4* xv, float off) {
    const unsigned q[4] = {a, b, c, d};
    float s = 0.f;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        s = fmaf(BF(q[k], 0, off), xv[k].x, s); s = fmaf(BF(q[k], 1, off), xv[k].y, s);
        s = fmaf(BF(q[k], 2, off), xv[k].z, s); s = fmaf(BF(q[k], 3, off), xv[k].w, s);
    }
    return s;
}
__device__ __forceinline__ float dot8(unsigned a, unsigned b, const float4* xv, float off) {
    float s = 0.f;
    s = fmaf(BF(a, 0, off), xv[0].x, s); s = fmaf(BF(a, 1, off), xv[0].y, s);
    s = fmaf(BF(a, 2, off), xv[0].z, s); s = fmaf(BF(a, 3, off), xv[0].w, s);
    s = fmaf(BF(b, 0, off), xv[1].x, s); s = fmaf(BF(b, 1, off), xv[1].y, s);
    s = fmaf(BF(b, 2, off), xv[1].z, s); s = fmaf(BF(b, 3, off), xv[1].w, s);
    return s;
}
// The 8 float4 of x that chunk c of type T meets, and the sums of its first and last 4 (what
// every T::dot takes): one loader for all the kernels that walk a row's chunks.
template <class T>
__device__ __forceinline__ void load_x(const float* xr, int c, float4 (&xv)[8], float& xa, float& xb) {
    #pragma unroll
    for (int k = 0; k < 8; k++) xv[k] = __ldg((const float4*)(xr + T::xoff(c, k)));
    xa = (xv[0].x + xv[0].y + xv[0].z + xv[0].w) + (xv[1].x + xv[1].y + xv[1].z + xv[1].w)
       + (xv[2].x + xv[2].y + xv[2].z + xv[2].w) + (xv[3].x + xv[3].y + xv[3].z + xv[3].w);
    xb = (xv[4].x + xv[4].y + xv[4].z + xv[4].w) + (xv[5].x + xv[5].y + xv[5].z + xv[5].w)
       + (xv[6].x + xv[6].y + xv[6].z + xv[6].w) + (xv[7].x + xv[7].y + xv[7].z + xv[7].w);
}
// acc summed over a block of 4 warps: each warp by shuffles, then the warps' partials through red
// (ends with a __syncthreads). Thread r*NX+n (< NR*NX) gets row r, x n; the others get 0.
template <int NR, int NX>   // not R, N: matvec_iq.py #defines R
__device__ __forceinline__ float block_sum(const float (&acc)[NR][NX], float (&red)[4][NR * NX]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    #pragma unroll
    for (int r = 0; r < NR; r++)
        #pragma unroll
        for (int n = 0; n < NX; n++) {
            float v = acc[r][n];
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) red[warp][r * NX + n] = v;
        }
    __syncthreads();
    const int i = threadIdx.x;
    return i < NR * NX ? (red[0][i] + red[1][i]) + (red[2][i] + red[3][i]) : 0.f;
}
// 6-bit scales (sc) and minimums (mn) of Q4_K/Q5_K sub-blocks 2j, 2j+1 as bytes e, e+1 of a word.
__device__ __forceinline__ float kblock_scales(uint4 h, int j, float sa, float sb, float xa, float xb) {
    const bool lo = j < 2;
    const unsigned sc = lo ? (h.y & 0x3F3F3F3Fu) : ((h.w & LO4) | ((h.y >> 2) & 0x30303030u));
    const unsigned mn = lo ? (h.z & 0x3F3F3F3Fu) : (((h.w >> 4) & LO4) | ((h.z >> 2) & 0x30303030u));
    const int e = 2 * (j & 1);
    const float d = lt_h2f((unsigned short)(h.x & 0xFFFFu)), dm = lt_h2f((unsigned short)(h.x >> 16));
    return d * (BF(sc, e, 0.f) * sa + BF(sc, e + 1, 0.f) * sb) - dm * (BF(mn, e, 0.f) * xa + BF(mn, e + 1, 0.f) * xb);
}
"""


C_KERNEL = r"""
// The loop every register-kernel launch runs: acc[r][n] = row r . x n over this thread's chunks.
template <class T, int N, int R, int P>
__device__ __forceinline__ void mv_rows(const unsigned char* const (&rowp)[R], const float* __restrict__ x,
                                        int cols, int chunks, float (&acc)[R][N]) {
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    // P = 1: the next trip's weights are loaded before this trip's are used (software pipelining:
    // loads stay in flight while the thread computes, at the cost of R more Raw in registers).
    typename T::Raw cur[R];
    if (P == 1) {
        #pragma unroll
        for (int r = 0; r < R; r++) T::load(cur[r], rowp[r], min((int)threadIdx.x, chunks - 1));
    }
    for (int c = threadIdx.x; c < chunks; c += 128) {
        typename T::Raw nxt[R];
        #pragma unroll
        for (int r = 0; r < R; r++) {
            if (P == 1) T::load(nxt[r], rowp[r], min(c + 128, chunks - 1));
            else T::load(cur[r], rowp[r], c);
        }
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float4 xv[8];
            float xa, xb;
            load_x<T>(x + (long long)n * cols, c, xv, xa, xb);
            #pragma unroll
            for (int r = 0; r < R; r++) acc[r][n] += T::dot(cur[r], c, xv, xa, xb);
        }
        if (P == 1) {
            #pragma unroll
            for (int r = 0; r < R; r++) cur[r] = nxt[r];
        }
    }
}
// P = 2 (session 11): mv_rows<P = 0>, but where a row's chunks end in half a trip (448: 14336
// columns) that half goes to all 128 threads with half the rows each, so that the warps reach the
// closing barrier together (else warps 0-1 do one trip more than 2-3; session 10's Nsight put ~12%
// of IQ3_XXS's stall samples on that barrier). The P = 0 loop is called as it is: folding the half
// into its loop changed its code (session 11, call 13: 13.7 -> 14.0 us, and 14.7 -> 15.4 at 4096
// columns, where there is no half trip).
template <class T, int N, int R, int P>
__device__ __forceinline__ void mv_rows_any(const unsigned char* const (&rowp)[R], const float* __restrict__ x,
                                            int cols, int chunks, float (&acc)[R][N]) {
    if constexpr (P != 2) {
        mv_rows<T, N, R, P>(rowp, x, cols, chunks, acc);
    } else {
        const bool halves = R % 2 == 0 && (chunks & 127) == 64;
        mv_rows<T, N, R, 0>(rowp, x, cols, halves ? chunks - 64 : chunks, acc);
        if constexpr (R % 2 == 0) if (halves) {   // (R odd: no halves, and raw[R / 2] would be empty)
            const int c = chunks - 64 + (threadIdx.x & 63), h = threadIdx.x >> 6;   // (h: the same across a warp)
            typename T::Raw raw[R / 2];
            #pragma unroll
            for (int q = 0; q < R / 2; q++) T::load(raw[q], h ? rowp[q + R / 2] : rowp[q], c);
            #pragma unroll
            for (int n = 0; n < N; n++) {
                float4 xv[8];
                float xa, xb;
                load_x<T>(x + (long long)n * cols, c, xv, xa, xb);
                #pragma unroll
                for (int q = 0; q < R / 2; q++) {
                    const float v = T::dot(raw[q], c, xv, xa, xb);
                    acc[q][n] += h ? 0.f : v;
                    acc[q + R / 2][n] += h ? v : 0.f;
                }
            }
        }
    }
}
// mv's whole body, also the body of kernels that set something up first (matvec_iq_v2's mv_iq2).
template <class T, int N, int R, int P>
__device__ __forceinline__ void mv_body(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                        float* __restrict__ out, int rows, int cols) {
    const int row0 = blockIdx.x * R, nb = cols / T::BE, chunks = nb * T::CPB;
    const long long rb = (long long)nb * T::TS;
    const unsigned char* rowp[R];
    #pragma unroll
    for (int r = 0; r < R; r++)   // rows past the end re-read the last row and are not written
        rowp[r] = w + (long long)min(row0 + r, rows - 1) * rb;
    PDL_PROLOGUE();               // (LITE_PDL, kernels/pdl.py)
    float acc[R][N];
    mv_rows_any<T, N, R, P>(rowp, x, cols, chunks, acc);
    __shared__ float red[4][R * N];
    const float total = block_sum<R, N>(acc, red);       // thread r*N+n writes row r, x n
    if (threadIdx.x < R * N) {
        const int r = threadIdx.x / N, n = threadIdx.x % N;
        if (row0 + r < rows) out[(long long)n * rows + row0 + r] = total;
    }
}
template <class T, int N, int R, int P>
__global__ void __launch_bounds__(128) mv(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                          float* __restrict__ out, int rows, int cols) {
    mv_body<T, N, R, P>(w, x, out, rows, cols);
}
"""

TYPES = tuple(CONFIG)


def c_source():
    """The kernels' CUDA C."""
    return C_HEAD + C_TYPES + C_KERNEL


def decode_struct(qtype):
    """The struct every decode product of qtype takes (mv, matvec_epilogue's mve, the MoE experts'
    moe_mv/moe_mvw): T<type>, or T<type>H, the two-instruction dot, for the FAST_DOT types."""
    return f"TQ{qtype[1:]}" + ("H" if qtype in FAST_DOT else "")


def kernel_name(qtype, n, fast, rows, prefetch):
    """The register kernel over qtype's float struct (fast: its two-instruction dot)."""
    return f"mv<TQ{qtype[1:]}{'H' if fast else ''}, {n}, {rows}, {prefetch}>"


@functools.lru_cache(maxsize=None)
def raw_module(device, qtype, config, ns=tuple(range(1, C_MAX_N + 1)), head=""):
    """The compiled kernels of one type and config (see CONFIG) for each n in ns (compiling is
    ~0.5 s a kernel, so launch() builds only the type and n it meets). head: pdl.source_head(pdl)."""
    import cupy
    names = [kernel_name(qtype, n, *config) for n in ns]
    return cupy.RawModule(code=head + c_source(), options=("--std=c++17",),
                          name_expressions=names)


@functools.lru_cache(maxsize=None)
def _kernel(device, qtype, config, n, head=""):
    return raw_module(device, qtype, config, (n,), head).get_function(kernel_name(qtype, n, *config))


def _ptr(a):
    return a.data.ptr


def qualifies(qtype, blocks, x):
    """True when the CUDA C kernel can take these (device) arrays: aligned blocks and x."""
    return qtype in CONFIG and _ptr(blocks) % ALIGN[qtype] == 0 and _ptr(x) % 16 == 0


def plan(qtype, n):
    """(fast, rows a CTA, prefetch) of one launch of n rows of x: CONFIG's, the two-instruction dot
    for FAST_DOT types at n <= 2, at most 4 rows a CTA when n > 2 (R * n accumulators spill beyond)."""
    rows, prefetch = CONFIG[qtype]
    if n > 2:
        return False, min(rows, 4), prefetch
    return qtype in FAST_DOT, rows, prefetch


def launch(qtype, blocks, x, out, rows, cols, stream=None, cta=None, pdl=False, int8_dot_types=INT8_DOT_TYPES):
    """Enqueue out = x @ W.T on `stream` (a CuPy stream, None: the current one). Inputs are checked
    by the caller (matvec_basic): blocks 1-D uint8 of rows x cols, x (n, cols) and out (n, rows)
    C-contiguous float32, qualifies() true. The types int8_dot_types names run on dp4a over quantized x (matvec_q8), the others the register kernel; cta: (rows a
    CTA, prefetch) of the register kernel instead of plan()'s (tests). pdl: launched with PDL.
    One launch per C_MAX_N rows of x and no host synchronization: meant to be captured."""
    import cupy

    from lite.kernels import matvec_q8       # (it imports this module)
    device = cupy.cuda.runtime.getDevice()
    int8 = cta is None and matvec_q8.applies(qtype, int8_dot_types)
    with stream if stream is not None else contextlib.nullcontext():
        for i in range(0, x.shape[0], C_MAX_N):
            xs, os_ = x[i:i + C_MAX_N], out[i:i + C_MAX_N]
            n = xs.shape[0]
            if int8:
                matvec_q8.launch(qtype, blocks, xs, cupy.empty_like(xs), os_, rows, cols, pdl=pdl)
                continue
            cfg = plan(qtype, n) if cta is None else (False, min(cta[0], 4) if n > 2 else cta[0], cta[1])
            pdl_mod.call(_kernel(device, qtype, cfg, n, pdl_mod.source_head(pdl)),
                         ((rows + cfg[1] - 1) // cfg[1],), (THREADS,),
                         (blocks, xs, os_, np.int32(rows), np.int32(cols)), pdl=pdl)
