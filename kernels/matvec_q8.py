"""Decode matvec on integer dot products (`mvq`, session 7): x quantized once per product to int8
in two parts (`qx`), then 4 weights a `dp4a` instead of 2 instructions a weight. The default for
every dense Q4_K decode product since session 7 (H200: 8B decode 371 -> 419 tok/s, BENCHMARKS);
since session 8 also Q6_K, IQ3_XXS and the MoE experts' products (8B IQ3_XXS decode 217 -> 344,
30B-A3B IQ3_XXS 286 -> 338, 30B-A3B Q4_K 369 -> 389; LITE_MATVEC_Q8, LITE_MOE_Q8, below).

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
The Q4_K minimums (and Q6_K's -32 offset) take the run's sum of the quantized x, so that what
mvq computes is W times quantized x, up to fp32 rounding.

Layout of quantized x (`qx` writes it, 8 threads a chunk): for chunk c of a row, 80 bytes at byte
80 c: hi of run a, hi of run b, lo of run a, lo of run b (16 int8 each), then float4 (d_a, sum_a, d_b,
sum_b) (Q6_K: 96 bytes, the sums by 8 values); rows of x `cols` floats apart, as x itself. So TQ4_KQ
below is a struct of matvec_cuda's register loop as it stands: its xoff points load_x at the 5
vectors of a record (the loads of 3 more and load_x's sums of x go unused and are dropped by the
compiler), and its dot reads them as integers; mv<TQ4_KQ, ...> is mv over quantized x.
"""
import functools

import numpy as np

from lite.kernels import matvec_cuda, matvec_q8_iq3
from lite.kernels import pdl as pdl_mod

C_Q8_BASE = r"""
#ifndef LT_Q8_LAYOUT20   // the modules set them from LAYOUTS below (layout_define())
#define LT_Q8_LAYOUT20 0
#endif
#ifndef LT_Q8_LAYOUT24
#define LT_Q8_LAYOUT24 0
#endif
// Where word w (0..RW-1) of chunk c's record lies in a row of quantized x, by the layout of records
// of RW words (20: Q4_K, IQ3_XXS; 24: Q6_K). Layout 0: records one after another (RW c + w).
// Layout 1 (session 8): the 8 records of a 256-value block interleaved by float4, so that the 8
// lanes walking a block's chunks read 128 contiguous bytes a float4 (a warp's float4 load of layout
// 0 spans 32 records 80 bytes apart: 20 cache lines, against 4).
// RW = 18 (session 13, kernels/matvec_mma.py's mvb): a block of 8 chunks in 144 words, so that each lane
// of the mma's warp reads its x words of the block's 4 chunk pairs as one 16-byte load, and its runs' d
// as another: word 4 L + p holds lane L's word of chunk pair p (L = 4 (4 (c & 1) + 2 run + lo) + w: its
// B column and k), word 128 + 4 (2 (c & 1) + run) + p the d of chunk 2 p + (c & 1)'s run (w = 16 + run).
template <int RW>
__device__ __forceinline__ int lt_q8w(int c, int w) {
    if (RW == 18) {
        const int p = (c & 7) >> 1, h = c & 1;
        if (w >= 16) return (c >> 3) * 144 + 128 + 4 * (2 * h + (w - 16)) + p;
        return (c >> 3) * 144 + 4 * (4 * (4 * h + 2 * ((w >> 2) & 1) + (w >> 3)) + (w & 3)) + p;
    }
    if ((RW == 24 ? LT_Q8_LAYOUT24 : LT_Q8_LAYOUT20) != 0)
        return (c >> 3) * (8 * RW) + (w >> 2) * 32 + (c & 7) * 4 + (w & 3);
    return RW * c + w;
}
// 4 int8 (the low bytes of a..d) in a word, a first.
__device__ __forceinline__ unsigned lt_pack4(int a, int b, int c, int d) {
    return (unsigned)(a & 0xFF) | ((unsigned)(b & 0xFF) << 8) | ((unsigned)(c & 0xFF) << 16) | ((unsigned)d << 24);
}
// x (n rows of cols floats) -> its records in xq (rows cols floats apart), RW words a chunk. A
// thread a float4 of x, 8 a chunk (4 a run of 16: T::xoff(c, 0..3) and (c, 4..7)), so that a
// 4096-wide x takes 8 CTAs, not one (session 7's trace: 2.7 us a launch with a thread a chunk).
// Grid (cols / 4 / 128 rounded up, n). T: the type's float struct, whose xoff says which x a chunk
// meets. Words 0-15: hi of run a, hi of run b, lo of run a, lo of run b; then RW = 20 (Q4_K):
// d_a, sum_a, d_b, sum_b; RW = 24 (Q6_K, whose scales go by 8 values): d_a, d_b, the sums of
// the four 8-value halves (float4 pairs 0-1, 2-3, 4-5, 6-7), 2 unused.
// qx_one: float4 k of chunk c of the row x (its record into the row o, global or shared memory);
// all 8 lanes of a chunk call it together (shuffles), `live` false past the row's end.
template <class T, int RW>
__device__ __forceinline__ void qx_one(const float* __restrict__ x, unsigned* o, int c, int k, bool live) {
    const float4 v = live ? __ldg((const float4*)(x + T::xoff(c, k))) : make_float4(0.f, 0.f, 0.f, 0.f);
    float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
    const float inv = a > 0.f ? 127.f / a : 0.f;
    const float t4[4] = {v.x * inv, v.y * inv, v.z * inv, v.w * inv};
    int qh[4], ql[4];
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        qh[i] = __float2int_rn(t4[i]);
        ql[i] = __float2int_rn((t4[i] - (float)qh[i]) * 254.f);
    }
    // sums of the quantized values (exact integers, |.| <= 16 * 32385): the minimums (Q4_K) and the
    // -32 offset (Q6_K) then meet the same x as the quants, so mvq is W times quantized x exactly
    const int i4 = (254 * qh[0] + ql[0]) + (254 * qh[1] + ql[1]) + (254 * qh[2] + ql[2]) + (254 * qh[3] + ql[3]);
    const int i8 = i4 + __shfl_xor_sync(0xffffffffu, i4, 1);
    const int i16 = i8 + __shfl_xor_sync(0xffffffffu, i8, 2);
    if (!live) return;
    const int run = k >> 2, w = k & 3;
    o[lt_q8w<RW>(c, 4 * run + w)] = lt_pack4(qh[0], qh[1], qh[2], qh[3]);
    o[lt_q8w<RW>(c, 8 + 4 * run + w)] = lt_pack4(ql[0], ql[1], ql[2], ql[3]);
    const float d = a * (1.f / (127.f * 254.f)), s8 = d * (float)i8, s16 = d * (float)i16;
    if constexpr (RW == 18) {
        if (w == 0) o[lt_q8w<RW>(c, 16 + run)] = __float_as_uint(d);
    } else if constexpr (RW == 20) {
        if (w == 0) { o[lt_q8w<RW>(c, 16 + 2 * run)] = __float_as_uint(d); o[lt_q8w<RW>(c, 17 + 2 * run)] = __float_as_uint(s16); }
    } else {
        if (w == 0) o[lt_q8w<RW>(c, 16 + run)] = __float_as_uint(d);
        if ((k & 1) == 0) o[lt_q8w<RW>(c, 18 + (k >> 1))] = __float_as_uint(s8);
    }
}
template <class T, int RW>
__global__ void __launch_bounds__(128) qx(const float* __restrict__ x, float* __restrict__ xq, int cols) {
    const int chunks = cols / T::BE * T::CPB, t = blockIdx.x * 128 + threadIdx.x;
    const long long row = (long long)blockIdx.y * cols;
    PDL_PROLOGUE();               // x is the previous kernel's output (LITE_PDL, kernels/pdl.py)
    qx_one<T, RW>(x + row, (unsigned*)(xq + row), t >> 3, t & 7, (t >> 3) < chunks);   // (no early return)
}
// qxe (session 11; the sweep's LITE_SWEEP_QXE=1, and since session 12 kernels/matvec_mma.py's quantizer):
// qx that lets the next kernel launch before it waits for the previous one, so that a product whose CTAs
// need a whole SM (mvt), or that loads weights before its PDL wait (mvb), is already queued when the
// product before qx ends.
template <class T, int RW>
__global__ void __launch_bounds__(128) qxe(const float* __restrict__ x, float* __restrict__ xq, int cols) {
    const int chunks = cols / T::BE * T::CPB, t = blockIdx.x * 128 + threadIdx.x;
    const long long row = (long long)blockIdx.y * cols;
#ifdef LT_PDL
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    qx_one<T, RW>(x + row, (unsigned*)(xq + row), t >> 3, t & 7, (t >> 3) < chunks);
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
"""
C_Q8_K = r"""struct TQ4_KQ : TQ4_K {   // TQ4_K's weights; x as qx's records
    __device__ static __forceinline__ int xoff(int c, int k) { return lt_q8w<20>(c, 4 * k); }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float, float) {
        const uint4 q = r.q, f = lt_u4(xv[4]);
        const float sa = __uint_as_float(f.x) * (float)lt_dot16q(q.x & LO4, q.y & LO4, q.z & LO4, q.w & LO4,
                                                                  lt_u4(xv[0]), lt_u4(xv[2]));
        const float sb = __uint_as_float(f.z) * (float)lt_dot16q((q.x >> 4) & LO4, (q.y >> 4) & LO4, (q.z >> 4) & LO4,
                                                                  (q.w >> 4) & LO4, lt_u4(xv[1]), lt_u4(xv[3]));
        return kblock_scales(r.h, (c & 7) >> 1, sa, sb, __uint_as_float(f.y), __uint_as_float(f.w));
    }
};
// 254 * (w . hi) + (w . lo) over 8 weights (2 words).
__device__ __forceinline__ int lt_dot8q(unsigned q0, unsigned q1, unsigned h0, unsigned h1, unsigned l0, unsigned l1) {
    const int sh = __dp4a((int)q1, (int)h1, __dp4a((int)q0, (int)h0, 0));
    const int sl = __dp4a((int)q1, (int)l1, __dp4a((int)q0, (int)l0, 0));
    return sh * 254 + sl;   // |.| <= 8 * 63 * 127 * 255 < 2^24: exact as a float too
}
struct TQ6_KQ : TQ6_K {   // TQ6_K's weights (values q in 0..63, q - 32 each); x as qx<TQ6_K, 24>'s records
    __device__ static __forceinline__ int xoff(int c, int k) { return lt_q8w<24>(c, 4 * k); }
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float, float) {
        const unsigned a0 = __funnelshift_r(r.a[0], r.a[1], r.sh), a1 = __funnelshift_r(r.a[1], r.a[2], r.sh);
        const unsigned b0 = __funnelshift_r(r.b[0], r.b[1], r.sh), b1 = __funnelshift_r(r.b[1], r.b[2], r.sh);
        const unsigned h0 = __funnelshift_r(r.h[0], r.h[1], r.sh), h1 = __funnelshift_r(r.h[1], r.h[2], r.sh);
        const unsigned sc0 = __funnelshift_r(r.s[0], r.s[1], r.sh) ^ 0x80808080u;   // as TQ6_K::dot
        const unsigned sc1 = __funnelshift_r(r.s[1], r.s[2], r.sh) ^ 0x80808080u;
        const int e = (c & 2) >> 1;
        const uint4 ha = lt_u4(xv[0]), hb = lt_u4(xv[1]), la = lt_u4(xv[2]), lb = lt_u4(xv[3]);
        const uint4 f = lt_u4(xv[4]), g = lt_u4(xv[5]);
        const float da = __uint_as_float(f.x), db = __uint_as_float(f.y);
        // run t: its 8 values' dot with x, less 32 * (the run's sum of x)
        const float r0 = fmaf(da, (float)lt_dot8q((a0 & LO4) | ((h0 << 4) & 0x30303030u), (a1 & LO4) | ((h1 << 4) & 0x30303030u),
                                                  ha.x, ha.y, la.x, la.y), -32.f * __uint_as_float(f.z));
        const float r1 = fmaf(da, (float)lt_dot8q((b0 & LO4) | ((h0 << 2) & 0x30303030u), (b1 & LO4) | ((h1 << 2) & 0x30303030u),
                                                  ha.z, ha.w, la.z, la.w), -32.f * __uint_as_float(f.w));
        const float r2 = fmaf(db, (float)lt_dot8q(((a0 >> 4) & LO4) | (h0 & 0x30303030u), ((a1 >> 4) & LO4) | (h1 & 0x30303030u),
                                                  hb.x, hb.y, lb.x, lb.y), -32.f * __uint_as_float(g.x));
        const float r3 = fmaf(db, (float)lt_dot8q(((b0 >> 4) & LO4) | ((h0 >> 2) & 0x30303030u), ((b1 >> 4) & LO4) | ((h1 >> 2) & 0x30303030u),
                                                  hb.z, hb.w, lb.z, lb.w), -32.f * __uint_as_float(g.y));
        const float s = BF(sc0, e, 128.f) * r0 + BF(sc0, e + 2, 128.f) * r1 + BF(sc1, e, 128.f) * r2 + BF(sc1, e + 2, 128.f) * r3;
        return lt_h2f(r.d) * s;
    }
};
"""

C_Q8 = C_Q8_BASE + C_Q8_K          # the K types' module text (after matvec_cuda's C_HEAD, C_TYPES)


# The record layout of quantized x by record size (LT_Q8_LAYOUT20 / 24 in C_Q8_BASE): layout 1 for
# Q6_K's 24-word records, 0 for the 20-word ones (Q4_K, IQ3_XXS): the faster of each (BENCHMARKS.md).
LAYOUTS = {20: 0, 24: 1}

C_MAX_N = matvec_cuda.C_MAX_N      # rows of x a launch (the register loop's N)

# The float struct whose x layout qx quantizes, the integer struct, and qx's words a chunk, per type.
# IQ3_XXS_G4: IQ3_XXS's blocks regrouped by the GPU backend (kernels/iq3_groups.py), the same x.
TYPES = {"Q4_K": ("TQ4_K", "TQ4_KQ", 20), "Q6_K": ("TQ6_K", "TQ6_KQ", 24), "IQ3_XXS": ("TIQ3_XXS", "TIQ3_XXSQV", 20),
         "IQ3_XXS_G4": ("TIQ3_XXS", "TIQ3_XXSG", 20)}
# (rows a CTA, prefetch) of every integer-dot launch, the decode epilogue kernels' (matvec_epilogue)
# too: the fastest at the decode shapes (BENCHMARKS.md). Few registers (~48), so 2 rows a CTA still
# keep enough warps a scheduler; IQ3_XXS_G4's prefetch 2 spreads a row's last half trip over all
# 128 threads (matvec_cuda's mv_rows_any).
CONFIGS = {"Q4_K": (2, 0), "Q6_K": (2, 0) if LAYOUTS[24] else (4, 0), "IQ3_XXS": (4, 0), "IQ3_XXS_G4": (4, 2)}
DEFAULT_TYPES = matvec_cuda.INT8_DOT_TYPES       # the types that can run on dp4a (all by default)


def record_words(chunks, rw, layout=None):
    """(chunks, rw) int array: where word w of chunk c's record lies in a row of quantized x (the
    index of lt_q8w in C_Q8_BASE, in 4-byte words)."""
    c, w = np.arange(chunks)[:, None], np.arange(rw)[None, :]
    if (LAYOUTS[rw] if layout is None else layout):
        return (c >> 3) * (8 * rw) + (w >> 2) * 32 + (c & 7) * 4 + (w & 3)
    return rw * c + w


def applies(qtype, int8_dot_types=DEFAULT_TYPES):
    """True when qtype's decode products take the integer-dot kernels: int8_dot_types names it
    (IQ3_XXS_G4: always, its only kernel; the backend makes that layout only where IQ3_XXS's
    applies, kernels/gpu_layout.py)."""
    return qtype in int8_dot_types or qtype == "IQ3_XXS_G4"


def applies_moe(qtype, int8_dot_types=DEFAULT_TYPES, moe_int8_dot=True):
    """The MoE decode experts' products (kernels/moe_mvw.py) on the same structs over quantized x:
    BackendConfig.moe_int8_dot, for the types int8_dot_types names."""
    return moe_int8_dot and applies(qtype, int8_dot_types)


# Block alignment the integer structs' loads need: the K types' as matvec_cuda.ALIGN; IQ3_XXS's
# 98-byte blocks are read in 16-bit halves, IQ3_XXS_G4's groups (kernels/iq3_groups.py) in 8-byte words.
ALIGN = {"Q4_K": matvec_cuda.ALIGN["Q4_K"], "Q6_K": matvec_cuda.ALIGN["Q6_K"], "IQ3_XXS": 2, "IQ3_XXS_G4": 8}


def qualifies(qtype, blocks, x, int8_dot_types=DEFAULT_TYPES):
    """True when qtype's products take the integer-dot kernels here and these device arrays are aligned for them."""
    return (applies(qtype, int8_dot_types) and matvec_cuda._ptr(blocks) % ALIGN[qtype] == 0
            and matvec_cuda._ptr(x) % 16 == 0)


def config(qtype):
    """(rows a CTA, prefetch) of qtype's integer-dot launches."""
    return CONFIGS[qtype]


def struct(qtype):
    """The integer struct of qtype's kernels (IQ3_XXS: with its table placement, matvec_q8_iq3.TABLES)."""
    if qtype.startswith("IQ3_XXS"):
        return matvec_q8_iq3.struct_name(grouped=qtype == "IQ3_XXS_G4")
    return TYPES[qtype][1]


def in_name(kernel_name):
    """True when a kernel's name instantiates one of the integer structs, so its module needs
    structs() (matvec_epilogue's and moe_mvw's kernel caches build the source from the name)."""
    return any(f"<{s}" in kernel_name for _, s, _ in TYPES.values())   # TIQ3_XXSQV<GC, SC> by its prefix


def c_source(qtype="Q4_K"):
    """The module text of qtype's quantizer and integer-dot kernels."""
    if qtype.startswith("IQ3_XXS"):
        return matvec_q8_iq3.c_base() + layout_define() + C_Q8_BASE + matvec_q8_iq3.c_text()
    return matvec_cuda.c_source() + layout_define() + C_Q8


def structs(qtype, tables=False):
    """The text that adds qtype's integer struct to a module holding its float struct (moe_mvw's);
    tables: also IQ3_XXS's offset-binary tables (a module without them)."""
    if qtype.startswith("IQ3_XXS"):
        from lite.kernels import iq_tables
        return (iq_tables.c_offset_tables() if tables else "") + layout_define() + C_Q8_BASE + matvec_q8_iq3.c_text()
    return layout_define() + C_Q8


def layout_define():
    """The lines that set quantized x's record layouts (LT_Q8_LAYOUT20 / 24 in C_Q8_BASE) to LAYOUTS."""
    return "".join(f"#define LT_Q8_LAYOUT{rw} {v}\n" for rw, v in LAYOUTS.items())


def quantize_name(qtype):
    return f"qx<{TYPES[qtype][0]}, {TYPES[qtype][2]}>"


def kernel_name(qtype, n, rows=8, prefetch=0, tables=None):
    """mv over quantized x; IQ3_XXS: mv_iq2 (mv with the struct's table fill first, matvec_q8_iq3).
    tables: IQ3_XXS's (GC, SC) instead of matvec_q8_iq3.TABLES."""
    if qtype.startswith("IQ3_XXS"):
        return f"mv_iq2<{matvec_q8_iq3.struct_name(tables, qtype == 'IQ3_XXS_G4')}, {n}, {rows}, {prefetch}>"
    return f"mv<{TYPES[qtype][1]}, {n}, {rows}, {prefetch}>"


@functools.lru_cache(maxsize=None)
def _module(device, qtype, names, head=""):
    import cupy
    return cupy.RawModule(code=head + c_source(qtype), options=("--std=c++17",), name_expressions=list(names))


def functions(device, qtype, n, rows=8, prefetch=0, pdl=False):
    """(quantizer, matvec) CuPy kernels of one type, n and CTA shape (pdl: compiled for PDL)."""
    names = (quantize_name(qtype), kernel_name(qtype, n, rows, prefetch))
    mod = _module(device, qtype, names, pdl_mod.source_head(pdl))
    return mod.get_function(names[0]), mod.get_function(names[1])


def quantize_grid(n, cols):
    """qx's grid for n rows of x of cols values: a thread a float4."""
    return ((cols // 4 + 127) // 128, n)


def quantize(qtype, x, pdl=False):
    """xq = qx(x) on CuPy's current stream (a new buffer shaped as x; one launch, PDL like the
    matvecs): what mv<TQ4_KQ> and mve<TQ4_KQ> read."""
    import cupy
    x = cupy.ascontiguousarray(x)                # rows cols floats apart, as qx reads them
    xq = cupy.empty_like(x)
    _quantize_into(qtype, x, xq, pdl)
    return xq


def _quantize_into(qtype, x, xq, pdl=False):
    """Enqueue qx(x) into xq (x C-contiguous (n, cols)); PDL like the matvecs."""
    import cupy
    # qx does not depend on n (grid y): take the module of n = 1, the decode step's
    quant = functions(cupy.cuda.runtime.getDevice(), qtype, 1, *config(qtype), pdl=pdl)[0]
    pdl_mod.call(quant, quantize_grid(*x.shape), (128,), (x, xq, np.int32(x.shape[1])), pdl=pdl)


def launch(qtype, blocks, x, xq, out, rows, cols, cta=None, pdl=False):
    """Enqueue xq = qx(x), then out = x @ W.T from xq, on CuPy's current stream (two launches, no
    host synchronization; meant to be captured). x (n, cols) float32, xq a float32 buffer of the
    same shape (scratch), out (n, rows) float32; n <= matvec_cuda.C_MAX_N; blocks aligned as
    matvec_cuda.ALIGN. cta: (rows a CTA, prefetch), default config(qtype)."""
    if qtype not in TYPES:
        raise ValueError(f"matvec_q8: no integer-dot kernel for {qtype} (have {', '.join(TYPES)})")
    import cupy
    n, cta = x.shape[0], cta or config(qtype)
    _quantize_into(qtype, x, xq, pdl)
    mv = functions(cupy.cuda.runtime.getDevice(), qtype, n, *cta, pdl=pdl)[1]
    pdl_mod.call(mv, ((rows + cta[0] - 1) // cta[0],), (matvec_cuda.THREADS,),
                 (blocks, xq, out, np.int32(rows), np.int32(cols)), pdl=pdl)
