"""Decode matvec structs with the dot in two instructions a weight instead of three (kind "mvf" of
kernels/matvec_cuda.py; Q4_K's default since session 6: 8B decode +6%, 30B-A3B +2% on the H200;
LITE_MATVEC_CONFIG="Q4_K=mv" turns it off).

Written after session 5's Nsight Compute reading of the register kernel (issue and latency bound
at 4-5 warps a scheduler, ~5 instructions a weight): the exponent trick of matvec_cuda (BF) places
a quant byte under 0x4B000000 (2^23 + b) and needs an FADD a weight to remove the 2^23 before the
FFMA. Here the byte goes under the exponent of 0.5 as mantissa bits 16-22, which reads as the exact
float 0.5 + b/256 for b < 128; the FFMA takes it as it is, and a 16-weight run's sum is corrected
once: sum x*b = 256 * sum x*(0.5 + b/256) - 128 * sum x (both scalings exact; the sum of x is
load_x's, which the K-quants' minimums already use). The 0.5 * x parts cancel in the correction:
a run's error relative to sum |x|*b is ~5e-7 typical, 6e-6 at worst (NumPy fp32 model of the
arithmetic, 20,000 random runs, half of them all-positive x; the three-instruction dot: 3e-7),
far inside the 1e-3 the kernels are held to. nvcc sm_90: mv<TQ4_KH, 1, 8, 0>
80 registers against mv<TQ4_K, 1, 8, 0>'s 95, PTX adds 419 -> 177.
"""

# Types with such a struct: T<type>H beside T<type> (matvec_cuda.kernel_name's "mvf").
FAST_DOT = ("Q4_K",)

# After matvec_cuda's C_TYPES (needs its LO4, kblock_scales and TQ4_K).
C_FAST_DOT = r"""
#define BH(w, j) __int_as_float(__byte_perm((w), 0x3F000000u, 0x7054u | ((j) << 8)))
__device__ __forceinline__ float dot16h(unsigned a, unsigned b, unsigned c, unsigned d, const float4* xv, float xs) {
    const unsigned q[4] = {a, b, c, d};
    float s = 0.f;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        s = fmaf(BH(q[k], 0), xv[k].x, s); s = fmaf(BH(q[k], 1), xv[k].y, s);
        s = fmaf(BH(q[k], 2), xv[k].z, s); s = fmaf(BH(q[k], 3), xv[k].w, s);
    }
    return fmaf(256.f, s, -128.f * xs);
}
struct TQ4_KH : TQ4_K {   // TQ4_K's loads and layout; the dot above for both nibble runs
    __device__ static __forceinline__ float dot(const Raw& r, int c, const float4 (&xv)[8], float xa, float xb) {
        const uint4 q = r.q;
        const float sa = dot16h(q.x & LO4, q.y & LO4, q.z & LO4, q.w & LO4, xv, xa);
        const float sb = dot16h((q.x >> 4) & LO4, (q.y >> 4) & LO4, (q.z >> 4) & LO4, (q.w >> 4) & LO4, xv + 4, xb);
        return kblock_scales(r.h, (c & 7) >> 1, sa, sb, xa, xb);
    }
};
"""
