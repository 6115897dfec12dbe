"""Q4_K decode matvec on integer dot products (`mvq`, opt-in, session 7): x quantized once per
launch to int8 in two parts, then 4 weights a `dp4a` instead of 2 instructions a weight.

Why: Nsight Compute (session 5) found the register matvec (kernels/matvec_cuda.py `mv`) bound by
issue and latency, not DRAM: ~5 instructions a weight for mv, ~2.5 for mvf, 80-95 registers, 4-5
warps a scheduler; at 4096x14336 mv reaches 45% of 4,130 GB/s against the 60% of issue 3. Here a
32-weight chunk of one Q4_K row costs ~50 instructions (16 dp4a, 12 to split nibbles, 4 to
combine, the sub-block scales) against mvf's ~80, and x takes 5 registers of 16 bytes a chunk
against 8 float4 plus 2 sums. llama.cpp's mmvq does the same with x in one int8 part (q8_1); one
part alone is ~0.3% off in a product, far outside the 1e-3 the kernels here are held to, so:

x in two int8 parts. Each run of 16 x values (a Q4_K chunk has two: the low nibbles meet x at
64j + l0 + [0, 16), the high ones at 64j + 32 + l0 + [0, 16)) takes a = max |x|,
t = x * 127 / a, hi = rint(t), lo = rint((t - hi) * 254): x = d * (254 hi + lo) with d = a / (127 * 254),
off by at most a / 64,516 (t - hi is exact; both parts lie in [-127, 127]). A row's run then sums
as the exact integer 254 * dp4a(w, hi) + dp4a(w, lo) (|.| < 2^23, so also exact as a float) times d.
The Q4_K minimums take the run's exact fp32 sum of x, as mv's do.

Layout of quantized x (`qx` writes it, one thread a chunk): for chunk c of a row, 80 bytes at byte
80 c: hi of run a, hi of run b, lo of run a, lo of run b (16 int8 each), then float4 (d_a, sum_a, d_b,
sum_b); rows of x `cols` floats apart, as x itself (2.5 of its 4 bytes a value used). So TQ4_KQ
below is a struct of matvec_cuda's register loop as it stands: its xoff points load_x at the 5
vectors of a record (the loads of 3 more and load_x's sums of x go unused and are dropped by the
compiler), and its dot reads them as integers; mv<TQ4_KQ, ...> is mv over quantized x.
"""
import functools
import os

import numpy as np

from lite.kernels import matvec_cuda, pdl

C_Q8 = r"""
// 4 int8 (the low bytes of a..d) in a word, a first.
__device__ __forceinline__ unsigned lt_pack4(int a, int b, int c, int d) {
    return (unsigned)(a & 0xFF) | ((unsigned)(b & 0xFF) << 8) | ((unsigned)(c & 0xFF) << 16) | ((unsigned)d << 24);
}
// x (n rows of cols floats) -> its 80-byte records in xq (rows cols floats apart). A thread a
// float4 of x, 8 a chunk (4 a run: T::xoff(c, 0..3) and (c, 4..7)), so that a 4096-wide x takes
// 8 CTAs, not one (session 7's trace: 2.7 us a launch with a thread a chunk). Grid
// (cols / 4 / 128 rounded up, n). T: the type's float struct, whose xoff says which x a chunk meets.
template <class T>
__global__ void __launch_bounds__(128) qx(const float* __restrict__ x, float* __restrict__ xq, int cols) {
    const int chunks = cols / T::BE * T::CPB, t = blockIdx.x * 128 + threadIdx.x;
    const int c = t >> 3, k = t & 7;
    const bool live = c < chunks;             // no early return: the run's lanes shuffle together
    const long long row = (long long)blockIdx.y * cols;
    PDL_PROLOGUE();               // x is the previous kernel's output (LITE_PDL, kernels/pdl.py)
    const float4 v = live ? __ldg((const float4*)(x + row + T::xoff(c, k))) : make_float4(0.f, 0.f, 0.f, 0.f);
    float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    float s = (v.x + v.y) + (v.z + v.w);
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1)); s += __shfl_xor_sync(0xffffffffu, s, 1);
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2)); s += __shfl_xor_sync(0xffffffffu, s, 2);
    const float inv = a > 0.f ? 127.f / a : 0.f;
    const float t4[4] = {v.x * inv, v.y * inv, v.z * inv, v.w * inv};
    int qh[4], ql[4];
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        qh[i] = __float2int_rn(t4[i]);
        ql[i] = __float2int_rn((t4[i] - (float)qh[i]) * 254.f);
    }
    if (!live) return;
    unsigned* o = (unsigned*)(xq + row) + 20 * c;   // words: ha 0-3, hb 4-7, la 8-11, lb 12-15, f 16-19
    const int run = k >> 2, w = k & 3;
    o[4 * run + w] = lt_pack4(qh[0], qh[1], qh[2], qh[3]);
    o[8 + 4 * run + w] = lt_pack4(ql[0], ql[1], ql[2], ql[3]);
    if (w == 0) {
        o[16 + 2 * run] = __float_as_uint(a * (1.f / (127.f * 254.f)));
        o[17 + 2 * run] = __float_as_uint(s);
    }
}
__device__ __forceinline__ uint4 lt_u4(float4 v) {
    return make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z), __float_as_uint(v.w));
}
// 254 * (w . hi) + (w . lo) over 16 weights, 4 bytes a word (q of weights, h and l of x).
__device__ __forceinline__ int lt_dot16q(unsigned q0, unsigned q1, unsigned q2, unsigned q3, uint4 h, uint4 l) {
    int sh = __dp4a((int)q0, (int)h.x, 0), sl = __dp4a((int)q0, (int)l.x, 0);
    sh = __dp4a((int)q1, (int)h.y, sh); sl = __dp4a((int)q1, (int)l.y, sl);
    sh = __dp4a((int)q2, (int)h.z, sh); sl = __dp4a((int)q2, (int)l.z, sl);
    sh = __dp4a((int)q3, (int)h.w, sh); sl = __dp4a((int)q3, (int)l.w, sl);
    return sh * 254 + sl;
}
struct TQ4_KQ : TQ4_K {   // TQ4_K's weights; x as qx's records
    __device__ static __forceinline__ int xoff(int c, int k) { return 20 * c + 4 * k; }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float, float) {
        const uint4 q = r.q, f = lt_u4(xv[4]);
        const float sa = __uint_as_float(f.x) * (float)lt_dot16q(q.x & LO4, q.y & LO4, q.z & LO4, q.w & LO4,
                                                                  lt_u4(xv[0]), lt_u4(xv[2]));
        const float sb = __uint_as_float(f.z) * (float)lt_dot16q((q.x >> 4) & LO4, (q.y >> 4) & LO4, (q.z >> 4) & LO4,
                                                                  (q.w >> 4) & LO4, lt_u4(xv[1]), lt_u4(xv[3]));
        return kblock_scales(r.h, (c & 7) >> 1, sa, sb, __uint_as_float(f.y), __uint_as_float(f.w));
    }
};
"""

# The float struct whose x layout qx quantizes, and the integer struct, per type.
TYPES = {"Q4_K": ("TQ4_K", "TQ4_KQ")}
# (rows a CTA, prefetch) of every mvq launch, the decode epilogue kernels' (matvec_epilogue) too:
# the fastest at each of the 8B decode's Q4_K shapes in session 7's sweep (call 2: 4096x14336
# 14.1 us with the quantizer, mvf 20.7; 28672x4096 22.8 / 30.8; 6144x4096 8.7 / 8.4; 4096x4096
# 7.3 / 6.9): 48 registers, so 2 rows a CTA still keep ~10 warps a scheduler busy.
CONFIG = (2, 0)
# LITE_MATVEC_Q8=1: every dense Q4_K decode product (matvec_cuda.launch without a config, and
# matvec_epilogue's mve) quantizes x and takes mvq; MoE experts keep their kernels.
ENABLED = os.environ.get("LITE_MATVEC_Q8", "1") == "1"


def applies(qtype):
    """True when qtype's decode products take mvq (LITE_MATVEC_Q8 and a type with a kernel)."""
    return ENABLED and qtype in TYPES


def struct(qtype):
    return TYPES[qtype][1]


def c_source():
    return matvec_cuda.c_source() + C_Q8


def quantize_name(qtype):
    return f"qx<{TYPES[qtype][0]}>"


def kernel_name(qtype, n, rows=8, prefetch=0):
    return f"mv<{TYPES[qtype][1]}, {n}, {rows}, {prefetch}>"


@functools.lru_cache(maxsize=None)
def _module(device, names, head=""):
    import cupy
    return cupy.RawModule(code=head + c_source(), options=("--std=c++17",), name_expressions=list(names))


def functions(device, qtype, n, rows=8, prefetch=0):
    """(quantizer, matvec) CuPy kernels of one type, n and CTA shape."""
    names = (quantize_name(qtype), kernel_name(qtype, n, rows, prefetch))
    mod = _module(device, names, pdl.source_head())
    return mod.get_function(names[0]), mod.get_function(names[1])


def quantize_grid(n, cols):
    """qx's grid for n rows of x of cols values: a thread a float4."""
    return ((cols // 4 + 127) // 128, n)


def quantize(qtype, x):
    """xq = qx(x) on CuPy's current stream (a new buffer shaped as x; one launch, PDL like the
    matvecs): what mv<TQ4_KQ> and mve<TQ4_KQ> read."""
    import cupy
    xq = cupy.empty_like(x)
    quant = functions(cupy.cuda.runtime.getDevice(), qtype, x.shape[0], *CONFIG)[0]
    pdl.call(quant, quantize_grid(x.shape[0], x.shape[1]), (128,), (x, xq, np.int32(x.shape[1])))
    return xq


def launch(qtype, blocks, x, xq, out, rows, cols, config=CONFIG):
    """Enqueue xq = qx(x), then out = x @ W.T from xq, on CuPy's current stream (two launches, no
    host synchronization; meant to be captured). x (n, cols) float32, xq a float32 buffer of the
    same shape (scratch), out (n, rows) float32; n <= matvec_cuda.C_MAX_N; blocks 16-byte aligned."""
    if qtype not in TYPES:
        raise ValueError(f"matvec_q8: no integer-dot kernel for {qtype} (have {', '.join(TYPES)})")
    import cupy
    n = x.shape[0]
    quant, mv = functions(cupy.cuda.runtime.getDevice(), qtype, n, *config)
    pdl.call(quant, quantize_grid(n, cols), (128,), (x, xq, np.int32(cols)))
    pdl.call(mv, ((rows + config[0] - 1) // config[0],), (matvec_cuda.THREADS,),
             (blocks, xq, out, np.int32(rows), np.int32(cols)))
