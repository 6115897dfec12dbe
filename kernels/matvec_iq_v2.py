"""IQ3_XXS decode matvec v2 (opt-in): fewer instructions a weight, same fp32 arithmetic contract.

Measured on the H200 in session 3 (BENCHMARKS: +8% at best against mvp8, slower on short rows);
its tables read through L1 (GCOPIES 0, session 6) have not run on a GPU. The CUDA C compiles with
nvcc (sm_90) and runs on the host through tests/cuda_c_emulator.py
(tests/test_matvec_iq_v2_emulated.py, against float64).
Opt-in: matvec_iq.launch_cuda(config=("v2", rows a CTA, prefetch)) or ("v2p", rows a CTA), or
LITE_IQ_MV="v2,8,0" in the environment; `python3 tests/gpu_sweep_matvec.py --types IQ3_XXS
--variants v280,v281,v240,v2p8,mvp8` times it beside the register kernel and the default mvp8.

Why: the default (TIQ3_XXS in kernels/matvec_iq.py on matvec_staged's persistent loop) runs at 17%
of copy bandwidth and is instruction-bound: 9.6 SASS instructions a weight (n = 1, 8 rows a CTA),
per weight a PRMT + FADD (byte to float), a SHF + LOP3 (sign into x), an FFMA, plus ~3 of sign
decoding (POPC for the parity) and grid addressing. Here:
  - Signs are applied to the grid bytes, 4 at a time, in offset binary: the shared-memory grid
    holds bytes 64 + g (g = 4..62 < 64), a shared-memory table maps the 7 stored sign bits
    (parity completed) to two words with byte 0x3F where the weight is negative, and
    u = G - 2 (G & M) is 64 + g or 64 - g in every byte (2..126: no borrow between bytes).
    One LOP3 + one IMAD per 4 weights instead of 2 instructions a weight and a POPC per 8.
  - Bytes become floats with ONE instruction and no FADD: PRMT puts u under 0x3F as the top
    mantissa bits, 0x3F|u|00|00 = 0.5 + u / 256 = 0.75 + s g / 256 exactly. The offset 0.75 is
    the same for every row, so a chunk's sum of FFMAs is corrected once: 256 (sum - 0.75 sum(x)),
    with sum(x) over the chunk computed once for all rows of the CTA (load_x's xa + xb). The
    cancellation costs ~5 of fp32's 24 bits at worst (g = 4), far below the 1e-3 bound.
  - The 4-bit scale (2s + 1) / 4 and d and the 256 fold into one multiply a row and chunk.
  - Bank conflicts of the random lookups: 16 interleaved copies of the grid (lane l reads copy
    l % 16: lanes l and l + 16 meet in one of 2 banks) and 8 of the 8-byte sign table (16 KB +
    8 KB of shared memory a CTA).
Loop and loads: mv_iq2 below is matvec_cuda's `mv` (R rows a CTA, x loaded once a chunk for all
R rows, prefetch P) plus the table fill, or matvec_staged's persistent `mvp`; TIQ3_XXS's Raw/load
(16-bit loads: blocks are 98 bytes, only 2-aligned).
SASS instructions in the loop a weight (nvcc 13 -arch=sm_90, n = 1; nvdisasm, loop body / (32 R)):
mv_iq2<8 rows, P=1> 4.67 (128 registers), <8, 0> 4.85 (80), <4, 0> 4.84 (72), <4, 1> 4.94 (80),
mvp<8> 5.98 (142; the loop holds the row-group reduction); the default mvp<TIQ3_XXS, 8> 9.6 (128),
mv_iq3xxs<1> 8.8. No spills. Of 4.67: PRMT + FFMA 2.06, lookups (12 a row and chunk, shift + LOP3
+ LDS each) 1.1, sign application 0.5, the 16-bit loads and their addresses ~0.6, scale ~0.2.
n = 2 runs <4 rows, P=0> (128 registers; <8, 1> spills 40 bytes).
"""
import functools

import numpy as np

from lite.errors import SettingError
from lite.kernels import matvec_cuda, matvec_iq, matvec_staged
from lite.kernels.dequant_iq import C_HELPERS, c_grid_array, grid_packed
from lite.kernels.iq_tables import KVALUES_IQ4, ksigns

CONFIGS = ("v2", "v2p")   # ("v2", R, P) on matvec_cuda's mv, ("v2p", R) on the persistent mvp


def grid64():
    """IQ3_XXS grid entries with every byte g replaced by 64 + g (uint32, 256)."""
    return (grid_packed("IQ3_XXS").view(np.uint8) + np.uint8(64)).view(np.uint32)


def sign_masks():
    """(128, 2) uint32: for the 7 stored sign bits, byte j of word h is 0x3F where weight
    4h + j of the group of 8 is negative (ksigns: the 8th bit completes an even parity)."""
    ks = ksigns().astype(np.uint32)
    bits = (ks[:, None] >> np.arange(8, dtype=np.uint32)) & 1
    b = (bits * 0x3F).astype(np.uint8).reshape(128, 8)
    return b.view(np.uint32).reshape(128, 2)


def _c_array(cname, vals):
    return f"__device__ const unsigned {cname}[{vals.size}] = {{{', '.join(f'{int(v):#x}u' for v in vals.reshape(-1))}}};\n"


def c_tables():
    return _c_array("IQ3XXS_GRID64", grid64()) + _c_array("IQ3XXS_SMASK", sign_masks())


C_IQ3_XXS_V2 = r"""
#define V2_GC 16    // grid copies
#define V2_SC 8     // sign-table copies
// GCOPIES 0 (matvec_iq.grid_copies(), the default since session 6): no shared copies, both tables
// (1 KB + 1 KB) read from global memory through L1, as the IQ3_XXS grid of the other kernels.
#if GCOPIES
__shared__ unsigned lt_v2_grid[256 * V2_GC];
__shared__ uint2 lt_v2_sign[128 * V2_SC];
#endif
// 0x3F | byte j of u | 0 | 0 = 0.5 + u_j / 256 (u_j < 128), one PRMT: bytes 4 (0x00) and 7 (0x3F)
// of the constant, byte j of u.
#define V2F(u, j) __int_as_float(__byte_perm((u), 0x3F000000u, 0x7044u | ((j) << 8)))
struct TIQ3_XXS2 : TIQ3_XXS {   // TIQ3_XXS's block layout, Raw and loads; another decode
    __device__ static __forceinline__ void init() {
#if GCOPIES
        for (int i = threadIdx.x; i < 256 * V2_GC; i += blockDim.x) lt_v2_grid[i] = IQ3XXS_GRID64[i / V2_GC];
        for (int i = threadIdx.x; i < 128 * V2_SC; i += blockDim.x) {
            const int e = i / V2_SC;
            lt_v2_sign[i] = make_uint2(IQ3XXS_SMASK[2 * e], IQ3XXS_SMASK[2 * e + 1]);
        }
        __syncthreads();
#endif
    }
    __device__ static __forceinline__ float dot(const Raw& r, int, const float4 (&xv)[8], float xa, float xb) {
        // Byte offsets built by one shift and one LOP3 each (the lane's copy in the low bits): entry e
        // of the grid at 64 e + 4 (lane % 16), of the sign table at 64 e + 8 (lane % 8).
#if GCOPIES
        const char* gb = (const char*)lt_v2_grid;
        const char* sb = (const char*)lt_v2_sign;
        const unsigned gl = 4u * (threadIdx.x % V2_GC), sl = 8u * (threadIdx.x % V2_SC);
#endif
        float sum = 0.f;
        #pragma unroll
        for (int l = 0; l < 4; l++) {   // sign group l: grid entries 2l, 2l+1
            const unsigned qq = (l < 2 ? r.q0 : r.q1) >> (16 * (l & 1));
#if GCOPIES
            const uint2 m = *(const uint2*)(sb + ((((r.aux >> (7 * l)) << 6) & 0x1FC0u) | sl));
            unsigned u0 = *(const unsigned*)(gb + (((qq << 6) & 0x3FC0u) | gl));
            unsigned u1 = *(const unsigned*)(gb + (((qq >> 2) & 0x3FC0u) | gl));
#else
            const unsigned e = (r.aux >> (7 * l)) & 127u;
            const uint2 m = make_uint2(__ldg(IQ3XXS_SMASK + 2 * e), __ldg(IQ3XXS_SMASK + 2 * e + 1));
            unsigned u0 = __ldg(IQ3XXS_GRID64 + (qq & 255u)), u1 = __ldg(IQ3XXS_GRID64 + ((qq >> 8) & 255u));
#endif
            u0 -= 2u * (u0 & m.x);        // 64 + g -> 64 - g where the weight is negative
            u1 -= 2u * (u1 & m.y);
            const float4 a = xv[2 * l], c = xv[2 * l + 1];
            sum = fmaf(V2F(u0, 0), a.x, sum); sum = fmaf(V2F(u0, 1), a.y, sum);
            sum = fmaf(V2F(u0, 2), a.z, sum); sum = fmaf(V2F(u0, 3), a.w, sum);
            sum = fmaf(V2F(u1, 0), c.x, sum); sum = fmaf(V2F(u1, 1), c.y, sum);
            sum = fmaf(V2F(u1, 2), c.z, sum); sum = fmaf(V2F(u1, 3), c.w, sum);
        }
        // d (0.5 + s) / 2 * 256 = 64 d (2s + 1); 2s + 1 by the 2^23 exponent trick (exact)
        const float odd = __int_as_float(0x4B000001u | ((r.aux >> 27) & 0x1Eu)) - 8388608.f;
        return (64.f * h2f(r.d)) * odd * fmaf(-0.75f, xa + xb, sum);
    }
};
// matvec_cuda's `mv` (mv_body: same grid, a CTA of 128 threads per RR rows; P = 1 prefetches the
// next trip's weights, P = 2 spreads a row's last half trip: mv_rows_any) with the tables' fill first (`mv` has no T::init). RR, not R: matvec_iq.py
// #defines R.
template <class T, int N, int RR, int P>
__global__ void __launch_bounds__(128) mv_iq2(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                              float* __restrict__ out, int rows, int cols) {
    T::init();
    mv_body<T, N, RR, P>(w, x, out, rows, cols);
}
"""


def c_source():
    """matvec_iq's source (as its c_source), matvec_cuda's loop (C_KERNEL: mv_rows, before
    matvec_iq's C_COMMON, which #defines R) and the v2 struct and kernels."""
    kv = ", ".join(str(int(v)) for v in KVALUES_IQ4)
    return (f"#define GCOPIES {matvec_iq.grid_copies()}\n" + C_HELPERS + c_grid_array("IQ3XXS_GRID", "IQ3_XXS") + c_tables()
            + f"__device__ const int IQ4_KVALUES[16] = {{{kv}}};\n"
            + matvec_cuda.C_HEAD + matvec_cuda.C_KERNEL + matvec_staged.C_STAGED + matvec_staged.C_PERSISTENT
            + matvec_iq.C_COMMON + matvec_iq.C_IQ3_XXS + matvec_iq.C_IQ4_XS + matvec_iq.C_IQ3_XXS_STAGED
            + C_IQ3_XXS_V2)


def kernel_name(n, config):
    if config[0] == "v2p":
        return matvec_staged.persistent_name("TIQ3_XXS2", n, config[1])
    rows, prefetch = (tuple(config[1:]) + (8, 0)[len(config) - 1:])[:2]   # defaults: 8 rows, no prefetch
    return f"mv_iq2<TIQ3_XXS2, {n}, {rows}, {prefetch}>"


def rows_per_cta(config):
    return config[1] if len(config) > 1 else 8


@functools.lru_cache(maxsize=None)
def _raw_module(device, names):
    import cupy
    return cupy.RawModule(code=c_source(), options=("--std=c++17",), name_expressions=list(names))


def get_function(device, n, config):
    name = kernel_name(n, config)
    return _raw_module(device, (name,)).get_function(name)


def launch(blocks, xs, out, rows, cols, config):
    """One launch, n = xs.shape[0] (1 or 2; more spills), on CuPy's current stream."""
    import cupy
    n = xs.shape[0]
    assert 1 <= n <= 2, "v2 kernels are instantiated for n <= 2"
    if n == 2:   # nvcc sm_90: mv_iq2<2, 8, 1> spills, mvp<2, 8> takes 254 registers; <2, 4, 0>: 128, none
        config = ("v2", 4, 0)
    device = cupy.cuda.runtime.getDevice()
    f = get_function(device, n, config)
    args = (blocks, xs, out, np.int32(rows), np.int32(cols))
    if config[0] == "v2p":
        matvec_staged.launch(f, 0, device, rows, rows_per_cta(config), args)
    else:
        f((-(-rows // rows_per_cta(config)),), (128,), args)


def parse(text):
    """LITE_IQ_MV text, e.g. "v2", "v2,8,0", "v2p,8" -> a config tuple (None for empty)."""
    if not text:
        return None
    kind, *nums = [t.strip() for t in text.split(",")]
    if kind not in CONFIGS or not all(v.isdigit() for v in nums):
        raise SettingError(f"LITE_IQ_MV: expected v2[,rows[,prefetch]] or v2p[,rows], got {text!r}")
    nums = [int(v) for v in nums] or [8]
    return (kind,) + tuple(nums) + ((0,) if kind == "v2" and len(nums) == 1 else ())
