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
import os

import numpy as np

from lite.errors import SettingError
from lite.kernels import matvec_half, matvec_staged, pdl
from lite.kernels.matvec_structs import C_TYPES, FAST_DOT  # noqa: F401  (C_TYPES: other modules read it here)
from lite.kernels.pdl import C_PDL

C_MAX_N = 8
THREADS = 128
# (rows a CTA, prefetch 0/1) per type: the best n=1 mean of 4096x14336 and 14336x4096 measured by
# tests/gpu_bench_matvec.py on the H200 (GB/s: Q4_0 1953 vs 1650 without prefetch, Q8_0 2696 vs
# 2549, Q4_K 1949, Q5_K 1966, Q6_K 2358; 16 rows a CTA lost everywhere).
CONFIG = {"Q4_0": (8, 1), "Q8_0": (8, 1), "Q4_K": (8, 0), "Q5_K": (4, 0), "Q6_K": (4, 0)}
# The kernel each type's decode launches take (n <= 2): ("mv",) the register kernel with CONFIG,
# ("mvs", rows a CTA, stages) the staged kernel, ("mvp", rows a CTA) the persistent register
# kernel (both in kernels/matvec_staged.py), ("mvh", rows a CTA[, 64]) the half2 kernel of
# kernels/matvec_half.py (Q4_K and Q6_K only, 64-weight chunks Q4_K only; measured slower, session 3). Others, and n > 2, take
# CONFIG's register kernel.
# mv won for every type here (H200, n=1, GB/s of weights, 4096x14336 / 14336x4096 / 4096x4096,
# tests/gpu_sweep_matvec.py; best of mvs 8x3, mvs 4x3, mvp 2/4/8 after the slash):
#   Q4_K 1837 1973 1411 / 1625 1597 1213     Q6_K 2280 2328 1817 / 1879 1886 1557
#   Q8_0 2811 2524 1922 / 2336 2278 1844     Q4_0 2029 1795 1312 / 1503 1684 1152
#   Q5_K 1920 1947 1462 / 1604 1669 1291
# Q4_K: "mvf", the register kernel with the dot in 2 instructions a weight (kernels/matvec_structs.py),
# in every Q4_K decode product (decode_struct: the epilogue kernels, the MoE experts). H200, session
# 6 (BENCHMARKS): 8B Q4_K decode 352.9 / 358.5 -> 377.2 / 376.3 tok/s, 30B-A3B 312.8 -> 318.3;
# LITE_MATVEC_CONFIG="Q4_K=mv" gives the three-instruction dot back.
DEFAULT = {"Q4_0": ("mv",), "Q8_0": ("mv",), "Q4_K": ("mvf", 8, 0), "Q5_K": ("mv",), "Q6_K": ("mv",)}


def config_from_env(text=None):
    """LITE_MATVEC_CONFIG="Q4_K=mvh,8;Q6_K=mvh,4,32": DEFAULT overrides (see kernel_name), so that
    another decode kernel can be timed end to end without a code change (opt-in, for benchmarks)."""
    text = os.environ.get("LITE_MATVEC_CONFIG", "") if text is None else text
    out = {}
    for item in filter(None, (t.strip() for t in text.split(";"))):
        qtype, _, spec = item.partition("=")
        kind, *nums = spec.split(",")
        if qtype not in DEFAULT or kind not in ("mv", "mvf", "mvs", "mvp", "mvh") or not all(
                n.strip().isdigit() for n in nums):
            raise SettingError(f"LITE_MATVEC_CONFIG: {item!r}: expected TYPE=mv|mvf|mvs|mvp|mvh[,int...] "
                             f"with TYPE in {', '.join(DEFAULT)}")
        out[qtype] = (kind,) + tuple(int(n) for n in nums)
    return out


DEFAULT.update(config_from_env())
# Tried and removed (session 7): LITE_MATVEC_XS, mv/mvf and mve copying x into shared memory first
# (all of a CTA's x loads in flight at once, for ncu's ~30% of cycles waiting on L1TEX). It lost on
# the H200: 8B Q4_K decode 278-280 tok/s against 379 without it; sweep at 4096x14336 mv 17.9 us,
# mv80x 34.2, mvf80x 33.3 (96 registers) (docs/bench/session7/call1/checks.log). Don't re-try it as it was.

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
# (bytes, chunks of 32 weights) a block: the staged kernel's stage sizes
BLOCK_LAYOUT = {"Q4_0": (18, 1), "Q8_0": (34, 1), "Q4_K": (144, 8), "Q5_K": (176, 8), "Q6_K": (210, 8)}


def c_source(half=False):
    """The kernels' CUDA C; `half` adds matvec_half's (only in modules that use it, so that the
    default kernels keep compiling from the text that has run on a GPU)."""
    return (C_HEAD + C_TYPES + C_KERNEL + matvec_staged.C_STAGED + matvec_staged.C_PERSISTENT
            + (matvec_half.C_HALF if half else ""))


def decode_struct(qtype):
    """The struct every decode product of qtype takes (mv, matvec_epilogue's mve, the MoE experts'
    moe_mv/moe_mvw): T<type>, or T<type>H, the two-instruction dot (kernels/matvec_structs.py), where
    DEFAULT makes "mvf" the type's decode kernel (Q4_K's default; LITE_MATVEC_CONFIG="Q4_K=mv": TQ4_K)."""
    return f"TQ{qtype[1:]}" + ("H" if DEFAULT.get(qtype, ("",))[0] == "mvf" else "")


def kernel_name(qtype, n, *config):
    """The kernel of a config: (rows, prefetch) or ("mv", rows, prefetch), ("mvf", rows, prefetch), ("mvs", rows, stages), ("mvp", rows), ("mvh", rows[,
    weights a chunk])."""
    kind, *p = config if isinstance(config[0], str) else ("mv",) + tuple(config)
    struct = f"TQ{qtype[1:]}"
    if kind == "mvs":
        return matvec_staged.kernel_name(struct, n, *p)
    if kind == "mvp":
        return matvec_staged.persistent_name(struct, n, *p)
    if kind == "mvh":
        return matvec_half.kernel_name(qtype, n, *p)
    if kind == "mvf":                     # mv with the two-instruction dot (FAST_DOT types)
        return f"mv<{struct}H, {n}, {p[0]}, {p[1]}>"
    return f"mv<{struct}, {n}, {p[0]}, {p[1]}>"


@functools.lru_cache(maxsize=None)
def raw_module(device, qtype, config, ns=tuple(range(1, C_MAX_N + 1)), head=""):
    """The compiled kernels of one type and config (see CONFIG) for each n in ns (compiling is
    ~0.5 s a kernel, so launch() builds only the type and n it meets). head: pdl.source_head()."""
    import cupy
    names = [kernel_name(qtype, n, *config) for n in ns]
    return cupy.RawModule(code=head + c_source(half=config[0] == "mvh"), options=("--std=c++17",),
                          name_expressions=names)


@functools.lru_cache(maxsize=None)
def _kernel(device, qtype, config, n, head=""):
    return raw_module(device, qtype, config, (n,), head).get_function(kernel_name(qtype, n, *config))


def _ptr(a):
    return a.data.ptr


def qualifies(qtype, blocks, x):
    """True when the CUDA C kernel can take these (device) arrays: aligned blocks and x."""
    return qtype in CONFIG and _ptr(blocks) % ALIGN[qtype] == 0 and _ptr(x) % 16 == 0


def _plan(qtype, config, n, staged_ok):
    """The config of one launch of n rows of x: `config` (see kernel_name) or DEFAULT's; the staged
    kernel only where its 16-byte copies can go, the half2 one only for Q4_K/Q6_K, the new kernels
    only for n <= 2; otherwise CONFIG's register kernel, at most 4 rows a CTA when n > 2 (R * n
    accumulators spill beyond)."""
    config = tuple(config or DEFAULT[qtype])
    if config == ("mv",):
        config = ("mv",) + CONFIG[qtype]
    elif not isinstance(config[0], str):
        config = ("mv",) + config
    if config[0] != "mv" and (n > 2 or (config[0] == "mvs" and not staged_ok)
                              or (config[0] == "mvh" and not matvec_half.supports(qtype, config))
                              or (config[0] == "mvf" and qtype not in FAST_DOT)):
        config = ("mv",) + CONFIG[qtype]
    if (config[0] == "mv" and n > 2) or (config[0] == "mvp" and n == 2):
        config = (config[0], min(config[1], 4)) + config[2:]   # mvp<8 rows, n=2> spills
    return config


def launch(qtype, blocks, x, out, rows, cols, stream=None, config=None):
    """Enqueue out = x @ W.T on `stream` (a CuPy stream, None: the current one). Inputs are checked
    by the caller (matvec_basic): blocks 1-D uint8 of rows x cols, x (n, cols) and out (n, rows)
    C-contiguous float32, qualifies() true. `config` overrides DEFAULT (see _plan). One launch per
    C_MAX_N rows of x and no host synchronization: meant to be captured into CUDA graphs."""
    import cupy
    device = cupy.cuda.runtime.getDevice()
    ts, cpb = BLOCK_LAYOUT[qtype]
    staged_ok = matvec_staged.qualifies(_ptr(blocks), cols // (32 * cpb) * ts)
    with stream if stream is not None else contextlib.nullcontext():
        for i in range(0, x.shape[0], C_MAX_N):
            xs, os_ = x[i:i + C_MAX_N], out[i:i + C_MAX_N]
            n = xs.shape[0]
            cfg = _plan(qtype, config, n, staged_ok)
            args = (blocks, xs, os_, np.int32(rows), np.int32(cols))
            if config is None and cfg[0] in ("mv", "mvf"):
                from lite.kernels import matvec_q8       # (it imports this module)
                if matvec_q8.applies(qtype):             # LITE_MATVEC_Q8: x quantized, mvq
                    matvec_q8.launch(qtype, blocks, xs, cupy.empty_like(xs), os_, rows, cols)
                    continue
            if cfg[0] in ("mv", "mvf"):   # LITE_PDL (kernels/pdl.py): only mv has the prologue
                pdl.call(_kernel(device, qtype, cfg, n, pdl.source_head()),
                         ((rows + cfg[1] - 1) // cfg[1],), (THREADS,), args)
                continue
            func = _kernel(device, qtype, cfg, n)
            if cfg[0] == "mvh":           # mv's grid: a CTA of THREADS per cfg[1] rows
                func(((rows + cfg[1] - 1) // cfg[1],), (THREADS,), args)
            else:
                smem = matvec_staged.smem_bytes(ts, cpb, *cfg[1:]) if cfg[0] == "mvs" else 0
                matvec_staged.launch(func, smem, device, rows, cfg[1], args)
