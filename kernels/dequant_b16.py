"""IQ3_XXS_B16 (kernels/iq3_b16.py's layout) dequantized to fp16 or fp32 rows: prefill's GEMMs over the GPU
backend's B16 matrices (lite/backends/cuda_linear.py _dequant_f16). Not in the registry: a record interleaves
16 rows, so unlike the registry's launchers this one needs the matrix's shape. H200 (session 15, call 2, fp16):
4096x14336 42.6 us (3,284 GB/s read + written, 83% of copy-vec16), 28672x4096 78.9; bit for bit what session
14's direct stores made (47.3, 91.4 us).

A warp a record (a band of 16 rows, a block of 256 columns), 4 records a CTA (2 for fp32); lane 4g + q
decodes its 32 grid words (rows g and g + 8, words q and q + 4 of each chunk) as 4 values each into
shared memory, from which the warp writes whole rows. The arithmetic is
gguf-py's, in its order: (d (0.5 + sc)) 0.5, times the grid value, the sign last, so that fp32
output equals gguf.quants.dequantize exactly.
"""
import functools

import numpy as np

from lite.kernels import iq3_b16

C_DQB = r"""
// O's CTA: W warps (a record each), the staging tile's row stride S (elements; the padding keeps the
// fragment-order writes at 2 (fp16) / 4 (fp32) wavefronts, the optimum for their bytes). 33 KB a CTA.
template <class O> struct LtDqb;
template <> struct LtDqb<unsigned short> { static constexpr int W = 4, S = 264; };
template <> struct LtDqb<float> { static constexpr int W = 2, S = 260; };
__device__ __forceinline__ void lt_dqb_put(float* o, float a, float b, float c, float d) {
    *(float4*)o = make_float4(a, b, c, d);
}
__device__ __forceinline__ void lt_dqb_put(unsigned short* o, float a, float b, float c, float d) {   // fp16 bits
    *(uint2*)o = make_uint2(f2h(a) | ((unsigned)f2h(b) << 16), f2h(c) | ((unsigned)f2h(d) << 16));
}
// A warp a record: lane 4g + q decodes its fields (rows g, g + 8; words q, q + 4 of each chunk) into the
// warp's tile in shared memory, then the warp writes the tile's 16 rows out 16 bytes a lane, a row (fp16)
// or half a row (fp32) a store. Session 15 (call 2, fp16): 4096x14336 47.3 -> 42.6 us, 28672x4096 91.4 -> 78.9,
// against storing the fragments' 8 bytes straight to the rows (8 rows a store).
template <class O>
__global__ void __launch_bounds__(32 * LtDqb<O>::W) dqb(const unsigned char* __restrict__ w, O* __restrict__ out,
                                                     int rows, int cols) {
    constexpr int W = LtDqb<O>::W, S = LtDqb<O>::S, V = 16 / sizeof(O);   // V: elements in 16 bytes
    __shared__ unsigned grid[256];
    __shared__ uint4 tile[W][16 * S * sizeof(O) / 16];     // uint4: 16-byte aligned
    for (int i = threadIdx.x; i < 256; i += 32 * W) grid[i] = IQ3XXS_GRID[i];
    __syncthreads();
    const int nblk = cols >> 8, band = blockIdx.y, warp = threadIdx.x >> 5, j = blockIdx.x * W + warp;
    if (j >= nblk) return;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const unsigned char* rec = w + ((long long)band * nblk + j) * 1632;
    O* const t = (O*)tile[warp];
    unsigned wd[12];
    #pragma unroll
    for (int p = 0; p < 3; p++) {
        const uint4 v = __ldg((const uint4*)(rec + 512 * p) + lane);
        wd[4 * p] = v.x; wd[4 * p + 1] = v.y; wd[4 * p + 2] = v.z; wd[4 * p + 3] = v.w;
    }
    const uint2 sc = __ldg((const uint2*)(rec + 1536) + g);
    const unsigned dd = __ldg((const unsigned*)(rec + 1600) + g);
    #pragma unroll
    for (int cp = 0; cp < 4; cp++)
        #pragma unroll
        for (int odd = 0; odd < 2; odd++)
            #pragma unroll
            for (int k = 0; k < 4; k++) {
                const int n = 4 * cp + k, c = 2 * cp + odd, row = g + 8 * (k & 1), word = q + 4 * (k >> 1);
                unsigned idx, signs;
                if (odd) {
                    idx = (wd[6 + cp] >> (8 * k)) & 255u;
                    const unsigned s = wd[10 + (n >> 3)] >> (n & 7);
                    signs = (s & 1u) | ((s >> 7) & 2u) | ((s >> 14) & 4u) | ((s >> 21) & 8u);
                } else {
                    const int bit = 12 * n, wi = bit >> 5, sh = bit & 31;
                    const unsigned f = (sh > 20 ? __funnelshift_r(wd[wi], wd[wi + 1], sh) : wd[wi] >> sh) & 0xFFFu;
                    idx = f & 255u;
                    signs = f >> 8;
                }
                const float d = h2f((unsigned short)((k & 1) ? dd >> 16 : dd & 0xFFFFu));
                const unsigned s4 = (((k & 1) ? sc.y : sc.x) >> (4 * c)) & 15u;
                const float db = d * (0.5f + (float)s4) * 0.5f;
                const unsigned gw = grid[idx];
                float v[4];
                #pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float x = db * (float)((gw >> (8 * i)) & 255u);
                    v[i] = (signs >> i) & 1u ? -x : x;
                }
                lt_dqb_put(t + row * S + 32 * c + 4 * word, v[0], v[1], v[2], v[3]);
            }
    __syncwarp();
    O* const o = out + (long long)16 * band * cols + 256 * j;
    #pragma unroll
    for (int i = lane; i < 16 * 256 / V; i += 32) {
        const int r = i / (256 / V), e = V * (i % (256 / V));
        *(uint4*)(o + (long long)r * cols + e) = *(const uint4*)(t + r * S + e);
    }
}
"""


def c_source():
    """C_DQB after the unsigned grid it reads (IQ3XXS_GRID, dequant_iq.c_grid_array)."""
    from lite.kernels import dequant_iq
    return dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS") + C_DQB


WARPS = {np.dtype(np.float16): 4, np.dtype(np.float32): 2}      # LtDqb<O>::W


def launch_shape(rows, cols, out_dtype):
    """(grid, block) of dqb for a rows x cols matrix of out_dtype: a warp a record."""
    w = WARPS[np.dtype(out_dtype)]
    return (-(-(cols // 256) // w), rows // 16), (32 * w,)


@functools.lru_cache(maxsize=None)
def _module(device):
    import cupy
    from lite.kernels import dequant_iq
    return cupy.RawModule(code=dequant_iq.C_HELPERS + c_source(), options=("--std=c++17",),
                          name_expressions=["dqb<float>", "dqb<unsigned short>"])


def dequantize(records, rows, cols, out_dtype=np.float16, stream=None, out=None):
    """IQ3_XXS_B16 records (iq3_b16.repack's) as a (rows, cols) matrix of out_dtype (float16 or
    float32) on `stream`, into `out` if given; no host synchronization."""
    import contextlib

    import cupy
    iq3_b16.check_shape(rows, cols)
    if records.size != iq3_b16.nbytes(rows, cols):
        raise ValueError(f"{iq3_b16.NAME}: {records.size} bytes for {rows}x{cols} (want {iq3_b16.nbytes(rows, cols)})")
    dt = np.dtype(out_dtype)
    if dt not in (np.dtype(np.float16), np.dtype(np.float32)):
        raise ValueError(f"{iq3_b16.NAME}: out_dtype float16 or float32, not {dt}")
    out = cupy.empty((rows, cols), dt) if out is None else out.reshape(rows, cols)
    f = _module(cupy.cuda.runtime.getDevice()).get_function("dqb<float>" if dt == np.float32 else "dqb<unsigned short>")
    with stream if stream is not None else contextlib.nullcontext():
        f(*launch_shape(rows, cols, dt), (records, out, np.int32(rows), np.int32(cols)))
    return out
