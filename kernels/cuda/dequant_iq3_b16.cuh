#include "iq3_b16_fields.cuh"

// O's CTA: W warps (a record each), the staging tile's row stride S (elements; the padding keeps the
// fragment-order writes at 2 (fp16) / 4 (fp32) wavefronts, the optimum for their bytes). 33 KB a CTA.
template <class O> struct Bands16DequantShape;
template <> struct Bands16DequantShape<unsigned short> { static constexpr int W = 4, S = 264; };
template <> struct Bands16DequantShape<float> { static constexpr int W = 2, S = 260; };
// Four decoded weights into the staging tile, as O (float, or fp16 bits).
__device__ __forceinline__ void store4(float* o, float a, float b, float c, float d) {
    *(float4*)o = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store4(unsigned short* o, float a, float b, float c, float d) {   // fp16 bits
    *(uint2*)o = make_uint2(f2h(a) | ((unsigned)f2h(b) << 16), f2h(c) | ((unsigned)f2h(d) << 16));
}
// A warp a record: lane 4g + q decodes its fields (rows g, g + 8; words q, q + 4 of each chunk) into the
// warp's tile in shared memory, then the warp writes the tile's 16 rows out 16 bytes a lane, a row (fp16)
// or half a row (fp32) a store: faster than storing the fragments' 8 bytes straight to the rows (8 rows a store).
template <class O>
__global__ void __launch_bounds__(32 * Bands16DequantShape<O>::W)
dequantize_bands16(const unsigned char* __restrict__ w, O* __restrict__ out, int rows, int cols) {
    constexpr int W = Bands16DequantShape<O>::W, S = Bands16DequantShape<O>::S;
    constexpr int V = 16 / sizeof(O);   // V: elements in 16 bytes
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
    band_words(rec, lane, wd);
    const uint2 sc = __ldg((const uint2*)(rec + 1536) + g);
    const unsigned dd = __ldg((const unsigned*)(rec + 1600) + g);
    #pragma unroll
    for (int cp = 0; cp < 4; cp++)
        #pragma unroll
        for (int odd = 0; odd < 2; odd++)
            #pragma unroll
            for (int k = 0; k < 4; k++) {
                const int c = 2 * cp + odd, row = g + 8 * (k & 1), word = q + 4 * (k >> 1);
                unsigned idx, signs;
                band_field(wd, cp, odd, k, idx, signs);
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
                store4(t + row * S + 32 * c + 4 * word, v[0], v[1], v[2], v[3]);
            }
    __syncwarp();
    O* const o = out + (long long)16 * band * cols + 256 * j;
    #pragma unroll
    for (int i = lane; i < 16 * 256 / V; i += 32) {
        const int r = i / (256 / V), e = V * (i % (256 / V));
        *(uint4*)(o + (long long)r * cols + e) = *(const uint4*)(t + r * S + e);
    }
}
