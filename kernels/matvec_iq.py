"""Fused dequantize-and-dot for IQ3_XXS and IQ4_XS: out (n, rows) f32 = x (n, cols) f32 @ W.T.

Two implementations of the same product:
- Numba (the reference, what CI runs under the simulator): one 32-thread block per row, a thread
  per group of 8 weights decoded by dequant_iq's per-type functions (so the decode is the one
  checked bit for bit against gguf-py), fp32 accumulation, reduce.warp_sum across the row.
- CUDA C (the GPU path, a CuPy RawModule): a 128-thread block per 4 rows, a thread per 32-weight
  sub-block. The x chunk a thread loads is reused for all 4 rows (x is 32 bits a weight against
  3-4.25 bits of weight, so without reuse x traffic would swamp L1); the sub-block scale
  multiplies once per 32 weights. IQ3_XXS: the grid sits in shared memory as packed bytes in 8
  interleaved copies (a first version with a float4 grid and a sign-mask table there ran at 8% of
  copy bandwidth on the H200, bound by bank conflicts of random 16-byte gathers); bytes become
  floats by the 2^23 exponent trick (PRMT + FADD, not the slow I2F unit), signs flip x's sign bit.
  Templated on n (up to C_MAX_N, larger n in chunks) so the accumulators stay in registers.
  For IQ3_XXS and n = 1 the same decode runs as a type (TIQ3_XXS) of the persistent kernel of
  kernels/matvec_persistent.py with 8 rows a CTA (faster than the register kernel there).
reference=True (BackendConfig.reference_kernels) takes the Numba kernels on the GPU too.
"""
import contextlib
import functools

import numpy as np
from numba import cuda, float32

from lite.kernels.dequant_iq import (
    C_HELPERS, _p_iq3_xxs, _p_iq4_xs, _ptr, _v_grid_sign, _v_nonlinear, c_grid_array,
)
from lite.kernels import matvec_cuda, matvec_persistent
from lite.kernels.iq_tables import KVALUES_IQ4, device_tables
from lite.kernels.reduce import warp_sum
from lite.kernels.registry import quant_info, register_matvec
from lite.kernels.util import SIMULATOR, numba_stream

MAX_N = 8          # x rows a Numba launch handles; more are done in chunks
# The same for CUDA C, per kernel: beyond these the fully unrolled body spills (ptxas -v, sm_90).
C_MAX_N = {"IQ3_XXS": 2, "IQ4_XS": 4}
_ROWS_PER_CTA = 4  # CUDA C kernel


def _make_numba_kernel(param, value):
    @cuda.jit
    def kernel(u8, w16, h16, tab, x, out, rows, cols, n):
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        blocks_per_row = cols // 256
        acc = cuda.local.array(MAX_N, float32)
        for i in range(MAX_N):
            acc[i] = float32(0.0)
        g = t
        while g < cols // 8:
            blk = g // 32
            a, gv, b = param(u8, w16, h16, tab, row * blocks_per_row + blk, g - blk * 32)
            for j in range(8):
                v = value(a, gv, b, j, tab)
                for i in range(n):
                    acc[i] += v * x[i, g * 8 + j]
            g += 32
        for i in range(MAX_N):          # every thread reaches every warp_sum (its contract)
            s = warp_sum(acc[i])
            if t == 0 and i < n:
                out[i, row] = s
    return kernel


NUMBA_KERNELS = {
    "IQ3_XXS": _make_numba_kernel(_p_iq3_xxs, _v_grid_sign),
    "IQ4_XS": _make_numba_kernel(_p_iq4_xs, _v_nonlinear),
}


def launch_numba(name, blocks, x, out, rows, cols, stream):
    views = (blocks, blocks.view(np.uint16), blocks.view(np.float16), device_tables(name))
    # CuPy's current stream must be the launch stream while Numba converts the arrays (it makes
    # the current stream wait on them); otherwise a graph capture on `stream` fails (seen on H200).
    with stream if stream is not None else contextlib.nullcontext():
        for i in range(0, x.shape[0], MAX_N):
            xs = x[i:i + MAX_N]
            NUMBA_KERNELS[name][rows, 32, numba_stream(stream)](
                *views, xs, out[i:i + MAX_N], rows, cols, xs.shape[0])


# ---- CUDA C ------------------------------------------------------------------------------------

C_COMMON = r"""
#define R 4
// 32 IQ4_XS weights times x: the 4 words of a sub-block (low nibbles its values 0..15 in byte order,
// high nibbles 16..31) through the 16-entry value table kv (shared memory), x as 8 float4.
__device__ __forceinline__ float iq4_dot32(const unsigned (&qw)[4], const float4* xv, const float* kv) {
    float sum = 0.f;
    #pragma unroll
    for (int k = 0; k < 4; k++) {   // bytes 4k..4k+3: low nibbles values 4k.., high 16+4k..
        const unsigned w = qw[k];
        const float4 a = xv[k], c = xv[k + 4];
        sum = fmaf(kv[w & 15u], a.x, sum);         sum = fmaf(kv[(w >> 8) & 15u], a.y, sum);
        sum = fmaf(kv[(w >> 16) & 15u], a.z, sum); sum = fmaf(kv[(w >> 24) & 15u], a.w, sum);
        sum = fmaf(kv[(w >> 4) & 15u], c.x, sum);  sum = fmaf(kv[(w >> 12) & 15u], c.y, sum);
        sum = fmaf(kv[(w >> 20) & 15u], c.z, sum); sum = fmaf(kv[w >> 28], c.w, sum);
    }
    return sum;
}
// Sums acc over the warp, then over the 4 warps of the block; thread r*N+n ends with row r, x n.
template <int N>
__device__ __forceinline__ void finish(float (&acc)[R][N], float* __restrict__ out, int rows, int row0) {
    __shared__ float red[4][R * N];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float v = acc[r][n];
            #pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == 0) red[warp][r * N + n] = v;
        }
    __syncthreads();
    if (threadIdx.x < R * N) {
        const int r = threadIdx.x / N, n = threadIdx.x % N;
        if (row0 + r < rows)
            out[(long long)n * rows + row0 + r] = red[0][threadIdx.x] + red[1][threadIdx.x]
                                                  + red[2][threadIdx.x] + red[3][threadIdx.x];
    }
}
#define XS(v, m) __int_as_float(__float_as_int(v) ^ (m))
"""

C_IQ3_XXS = r"""
#ifndef GCOPIES   // the modules set it first (GRID_COPIES); 0: no shared copy, the grid
#define GCOPIES 0  // read through L1 (TIQ3_XXS; the register kernel mv_iq3xxs keeps one in shared memory)
#endif
#define GSTRIDE (GCOPIES > 0 ? GCOPIES : 1)
// Grid byte j of packed entry e as a float, without the slow int->float conversion unit:
// 0x4B0000bb is 2^23 + bb exactly.
#define GB(e, j) (__int_as_float(__byte_perm((e), 0x4B000000u, 0x7540u | (j))) - 8388608.f)
// x with its sign flipped where bit j of sb is set.
#define SX(v, sb, j) __int_as_float(__float_as_int(v) ^ (((sb) << (31 - (j))) & 0x80000000u))
// 32 IQ3_XXS weights times x, unscaled: grid indices q0, q1 (two a 16-bit half), the sub-block's
// 4x7 sign bits in aux, gl this lane's copy of the grid (shared memory, GS copies interleaved; GS 0:
// the grid itself in global memory, read through L1), x as 8 float4.
template <int GS>
__device__ __forceinline__ float iq3xxs_dot32(unsigned q0, unsigned q1, unsigned aux, const float4* xv,
                                              const unsigned* gl) {
    float sum = 0.f;
    #pragma unroll
    for (int l = 0; l < 4; l++) {   // sign group l: grid entries 2l, 2l+1
        const unsigned sb = ksign((aux >> (7 * l)) & 127u);
        const unsigned qq = (l < 2 ? q0 : q1) >> (16 * (l & 1));
        const unsigned i0 = qq & 255u, i1 = (qq >> 8) & 255u;
        const unsigned g0 = GS ? gl[i0 * GS] : __ldg(gl + i0), g1 = GS ? gl[i1 * GS] : __ldg(gl + i1);
        const float4 a = xv[2 * l], c = xv[2 * l + 1];
        sum = fmaf(GB(g0, 0), SX(a.x, sb, 0), sum); sum = fmaf(GB(g0, 1), SX(a.y, sb, 1), sum);
        sum = fmaf(GB(g0, 2), SX(a.z, sb, 2), sum); sum = fmaf(GB(g0, 3), SX(a.w, sb, 3), sum);
        sum = fmaf(GB(g1, 0), SX(c.x, sb, 4), sum); sum = fmaf(GB(g1, 1), SX(c.y, sb, 5), sum);
        sum = fmaf(GB(g1, 2), SX(c.z, sb, 6), sum); sum = fmaf(GB(g1, 3), SX(c.w, sb, 7), sum);
    }
    return sum;
}
template <int N>
__global__ void __launch_bounds__(128) mv_iq3xxs(const unsigned short* __restrict__ w16,
        const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    // GCOPIES copies of the grid, interleaved, so lanes of a warp gathering random entries meet
    // fewer bank conflicts (lane l reads copy l % GCOPIES).
    // GSTRIDE copies: one with GCOPIES 0, the default (grid_copies(); H200, session 6: 39.1 -> 36.2 us
    // at 4096x14336 against 8 copies)
    __shared__ unsigned gs[256 * GSTRIDE];
    for (int i = threadIdx.x; i < 256 * GSTRIDE; i += 128) gs[i] = IQ3XXS_GRID[i / GSTRIDE];
    __syncthreads();
    const unsigned* gl = gs + (threadIdx.x % GSTRIDE);
    const int row0 = blockIdx.x * R, nsub = cols >> 5;
    const long long row_words = (long long)(cols >> 8) * 49;
    float acc[R][N];
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    for (int s = threadIdx.x; s < nsub; s += 128) {
        const int blk = s >> 3, ib = s & 7;
        unsigned q0[R], q1[R], aux[R];
        float db[R];
        #pragma unroll
        for (int r = 0; r < R; r++) {   // rows past the end re-read the last row; never written
            const unsigned short* b = w16 + min(row0 + r, rows - 1) * row_words + blk * 49;
            q0[r] = __ldg(b + 1 + 4 * ib) | ((unsigned)__ldg(b + 2 + 4 * ib) << 16);
            q1[r] = __ldg(b + 3 + 4 * ib) | ((unsigned)__ldg(b + 4 + 4 * ib) << 16);
            aux[r] = __ldg(b + 33 + 2 * ib) | ((unsigned)__ldg(b + 34 + 2 * ib) << 16);
            db[r] = h2f(__ldg(b)) * (0.5f + (float)(aux[r] >> 28)) * 0.5f;
        }
        #pragma unroll
        for (int n = 0; n < N; n++) {
            const float4* xp = (const float4*)(x + (long long)n * cols) + s * 8;
            float4 xv[8];
            #pragma unroll
            for (int k = 0; k < 8; k++) xv[k] = __ldg(xp + k);
            #pragma unroll
            for (int r = 0; r < R; r++)
                acc[r][n] = fmaf(db[r], iq3xxs_dot32<GSTRIDE>(q0[r], q1[r], aux[r], xv, gl), acc[r][n]);
        }
    }
    finish<N>(acc, out, rows, row0);
}
"""

C_IQ4_XS = r"""
template <int N>
__global__ void __launch_bounds__(128) mv_iq4xs(const unsigned* __restrict__ w32,
        const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    __shared__ float kv[16];
    if (threadIdx.x < 16) kv[threadIdx.x] = (float)IQ4_KVALUES[threadIdx.x];
    __syncthreads();
    const int row0 = blockIdx.x * R, nsub = cols >> 5;
    const long long row_words = (long long)(cols >> 8) * 34;
    float acc[R][N];
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    for (int s = threadIdx.x; s < nsub; s += 128) {
        const int blk = s >> 3, ib = s & 7;
        uint4 q[R];
        float dl[R];
        #pragma unroll
        for (int r = 0; r < R; r++) {
            const unsigned* b = w32 + min(row0 + r, rows - 1) * row_words + blk * 34;
            const uint2 lo = __ldg((const uint2*)(b + 2 + 4 * ib)), hi = __ldg((const uint2*)(b + 4 + 4 * ib));
            q[r] = make_uint4(lo.x, lo.y, hi.x, hi.y);
            const unsigned w0 = __ldg(b), w1 = __ldg(b + 1);
            const int ls = (int)(((w1 >> (8 * (ib >> 1) + 4 * (ib & 1))) & 15u) | (((w0 >> (16 + 2 * ib)) & 3u) << 4));
            dl[r] = h2f((unsigned short)(w0 & 0xffffu)) * (float)(ls - 32);
        }
        #pragma unroll
        for (int n = 0; n < N; n++) {
            const float4* xp = (const float4*)(x + (long long)n * cols) + s * 8;
            float4 xv[8];
            #pragma unroll
            for (int k = 0; k < 8; k++) xv[k] = __ldg(xp + k);
            #pragma unroll
            for (int r = 0; r < R; r++) {
                const unsigned qw[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
                acc[r][n] = fmaf(dl[r], iq4_dot32(qw, xv, kv), acc[r][n]);
            }
        }
    }
    finish<N>(acc, out, rows, row0);
}
"""


# IQ3_XXS as a type of the register loops (matvec_cuda's, the persistent one, the MoE experts'); the
# decode is C_IQ3_XXS's, a thread per sub-block.
C_IQ3_XXS_STAGED = r"""
__shared__ unsigned lt_iq3_grid[256 * GSTRIDE];
struct TIQ3_XXS {   // d, qs[64] (grid indices, 8 a sub-block), then a word a sub-block: 4x7 sign bits, scale
    static constexpr int BE = 256, TS = 98, CPB = 8;
    struct Raw { unsigned q0, q1, aux; unsigned short d; };
    __device__ static __forceinline__ void init() {
        if (GCOPIES == 0) return;
        for (int i = threadIdx.x; i < 256 * GCOPIES; i += blockDim.x) lt_iq3_grid[i] = IQ3XXS_GRID[i / GSTRIDE];
        __syncthreads();
    }
    template <bool SH = false> __device__ static __forceinline__ void load(Raw& r, const unsigned char* row, int c) {
        const unsigned char* b = row + (c >> 3) * TS;     // blocks are only 2-aligned: 16-bit loads
        const int ib = c & 7;
        r.q0 = ldh<SH>(b + 2 + 8 * ib) | ((unsigned)ldh<SH>(b + 4 + 8 * ib) << 16);
        r.q1 = ldh<SH>(b + 6 + 8 * ib) | ((unsigned)ldh<SH>(b + 8 + 8 * ib) << 16);
        r.aux = ldh<SH>(b + 66 + 4 * ib) | ((unsigned)ldh<SH>(b + 68 + 4 * ib) << 16);
        r.d = ldh<SH>(b);
    }
    __device__ static __forceinline__ int xoff(int c, int k) { return 32 * c + 4 * k; }
    __device__ static __forceinline__ float dot(const Raw& r, int, const float4 (&xv)[8], float, float) {
        const unsigned* gl = GCOPIES > 0 ? lt_iq3_grid + (threadIdx.x % GSTRIDE) : IQ3XXS_GRID;
        return h2f(r.d) * (0.5f + (float)(r.aux >> 28)) * 0.5f * iq3xxs_dot32<GCOPIES>(r.q0, r.q1, r.aux, xv, gl);
    }
};
"""
# IQ3_XXS's decode product over float x: the persistent kernel (kernels/matvec_persistent.py) with
# TIQ3_XXS, 8 rows a CTA, for n = 1 (n = 2 spills registers there: mv_iq3xxs, the register kernel).
PERSISTENT_ROWS = 8
# The IQ3_XXS grid copies a CTA fills in shared memory (GCOPIES in C_IQ3_XXS): none, the 1 KB grid is
# read from global memory through L1 (mv_iq3xxs keeps one copy in shared memory).
GRID_COPIES = 0


def grid_copies():
    """GRID_COPIES (kernels/moe_mvw.py's modules define GCOPIES from it)."""
    return GRID_COPIES


def c_source():
    kv = ", ".join(str(int(v)) for v in KVALUES_IQ4)
    # the persistent skeleton before C_COMMON, whose `#define R 4` would rename its template parameter
    return (f"#define GCOPIES {GRID_COPIES}\n" + C_HELPERS + c_grid_array("IQ3XXS_GRID", "IQ3_XXS")
            + f"__device__ const int IQ4_KVALUES[16] = {{{kv}}};\n"
            + matvec_cuda.C_HEAD + matvec_persistent.C_PERSISTENT
            + C_COMMON + C_IQ3_XXS + C_IQ4_XS + C_IQ3_XXS_STAGED)


_C_NAMES = {"IQ3_XXS": "mv_iq3xxs", "IQ4_XS": "mv_iq4xs"}
_STRUCTS = {"IQ3_XXS": "TIQ3_XXS"}


@functools.lru_cache(maxsize=None)
def _raw_module(device, names=None):
    """The kernels named, or without names every register kernel."""
    import cupy
    exprs = list(names or [f"{k}<{n}>" for name, k in _C_NAMES.items() for n in range(1, C_MAX_N[name] + 1)])
    return cupy.RawModule(code=c_source(), options=("--std=c++17",), name_expressions=exprs)


def launch_cuda(name, blocks, x, out, rows, cols, stream, pdl=False, int8_dot_types=matvec_cuda.INT8_DOT_TYPES):
    """IQ3_XXS (and IQ3_XXS_G4) on dp4a over quantized x where int8_dot_types names it (matvec_q8;
    pdl: launched with PDL), else IQ3_XXS's persistent kernel for n = 1 and the register kernels."""
    import cupy
    from lite.kernels import matvec_q8
    if matvec_q8.applies(name, int8_dot_types):      # IQ3_XXS on dp4a over quantized x
        with stream if stream is not None else contextlib.nullcontext():
            for i in range(0, x.shape[0], matvec_q8.C_MAX_N):
                xs = x[i:i + matvec_q8.C_MAX_N]
                matvec_q8.launch(name, blocks, xs, cupy.empty_like(xs), out[i:i + matvec_q8.C_MAX_N], rows, cols, pdl=pdl)
        return
    device = cupy.cuda.runtime.getDevice()
    with stream if stream is not None else contextlib.nullcontext():
        step = C_MAX_N[name]
        for i in range(0, x.shape[0], step):
            xs, os_ = x[i:i + step], out[i:i + step]
            n = xs.shape[0]
            args = (blocks, xs, os_, np.int32(rows), np.int32(cols))
            if name == "IQ3_XXS" and n == 1:
                kname = matvec_persistent.persistent_name(_STRUCTS[name], n, PERSISTENT_ROWS)
                func = _raw_module(device, (kname,)).get_function(kname)
                matvec_persistent.launch(func, 0, device, rows, PERSISTENT_ROWS, args)
                continue
            w = blocks.view(np.uint16 if name == "IQ3_XXS" else np.uint32)
            kern = _raw_module(device).get_function(f"{_C_NAMES[name]}<{n}>")
            kern((-(-rows // _ROWS_PER_CTA),), (128,), (w, xs, os_, np.int32(rows), np.int32(cols)))


def check_args(name, x, out, rows, cols, col_multiple):
    """The launchers' input checks (kernels/iq3_groups.py's too): cols a multiple of col_multiple
    (a block's values, or a group's), C-contiguous float32 x (n, cols) and out (n, rows)."""
    if cols % col_multiple:
        raise ValueError(f"{name} matvec: cols={cols} is not a multiple of {col_multiple}")
    if x.ndim != 2 or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError(f"{name} matvec: x must be a C-contiguous (n, {cols}) float32 array")
    if out.shape != (x.shape[0], rows) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"{name} matvec: out must be a C-contiguous ({x.shape[0]}, {rows}) float32 array")


def _register(name):
    info = quant_info(name)

    @register_matvec(name)
    def launch(blocks, x, out, rows, cols, stream=None, pdl=False, int8_dot_types=matvec_cuda.INT8_DOT_TYPES,
               reference=False):
        check_args(name, x, out, rows, cols, info.block_elems)
        aligned = _ptr(blocks) % (2 if name == "IQ3_XXS" else 8) == 0 and _ptr(x) % 16 == 0
        if not (SIMULATOR or reference) and aligned:
            return launch_cuda(name, blocks, x, out, rows, cols, stream, pdl, int8_dot_types)
        return launch_numba(name, blocks, x, out, rows, cols, stream)
    return launch


for _name in _C_NAMES:
    _register(_name)
