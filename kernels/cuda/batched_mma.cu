// batched_mma_product<W, NT> (kernels/batched_mma.py): out (n, rows) = x W^T for n rows of x on the int8 tensor
// cores. A CTA of 4 warps takes BMMA_ROWS weight rows (16 a warp) and NT rows of x (grid (n / NT rounded up,
// rows / BMMA_ROWS rounded up): the CTAs of one weight tile run side by side, so past NT rows of x the tile
// comes again from L2). Per K step of BMMA_K columns the CTA dequantizes the tile into int8 with its scales
// (batched_mma_weights.cuh) and copies x's parts from batched_quantize_x; then a warp, per run of 32 columns
// and 8 rows of x, multiplies the weights with hi and lo (two k = 32 mma; Q6_K four of k = 16) and adds
// d_x (w_scale (254 C_hi + C_lo)) (- w_min s_x) to its fp32 sums.
#include "batched_mma_common.cuh"
#include "batched_mma_weights.cuh"
#include "batched_mma_iq.cuh"

template <class W, int NT>
__global__ void __launch_bounds__(128) batched_mma_product(const unsigned char* __restrict__ w, const signed char* __restrict__ xhi,
        const signed char* __restrict__ xlo, const float* __restrict__ xd, const float* __restrict__ xs, float* __restrict__ out,
        int n, int rows, int cols) {
    __shared__ uint4 wq4[BMMA_ROWS * BMMA_STRIDE / 16], xh4[NT * BMMA_STRIDE / 16], xl4[NT * BMMA_STRIDE / 16];
    __shared__ float wsc[BMMA_ROWS * 16], wmn[BMMA_ROWS * 8], xds[NT * 8], xss[NT * 8];
    unsigned char* wq = (unsigned char*)wq4;
    const unsigned char *xh = (const unsigned char*)xh4, *xl = (const unsigned char*)xl4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int t0 = blockIdx.x * NT, r0 = blockIdx.y * BMMA_ROWS, runs = cols / 32;
    float acc[NT / 8][4];
    for (int j = 0; j < NT / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    PDL_PROLOGUE();
    for (int k0 = 0; k0 < cols; k0 += BMMA_K) {
        __syncthreads();                       // the last step's tiles are read
        W::tile(w, r0, rows, cols, k0, wq, wsc, wmn);
        for (int i = threadIdx.x; i < NT * 16; i += 128) {
            const int t = i >> 4, c = i & 15;
            uint4 h = make_uint4(0u, 0u, 0u, 0u), l = h;
            if (t0 + t < n) {
                const long long at = (long long)(t0 + t) * cols + k0;
                h = __ldg((const uint4*)(xhi + at) + c);
                l = __ldg((const uint4*)(xlo + at) + c);
            }
            xh4[t * (BMMA_STRIDE / 16) + c] = h;
            xl4[t * (BMMA_STRIDE / 16) + c] = l;
        }
        for (int i = threadIdx.x; i < NT * 8; i += 128) {
            const int t = i >> 3;
            const long long at = (long long)(t0 + t) * runs + k0 / 32 + (i & 7);
            xds[i] = t0 + t < n ? __ldg(xd + at) : 0.f;
            xss[i] = t0 + t < n ? __ldg(xs + at) : 0.f;
        }
        __syncthreads();
        const int ra = warp * 16 + g;          // this lane's weight rows ra, ra + 8
        #pragma unroll 1
        for (int r = 0; r < 8; r++) {
            const unsigned char* a = wq + ra * BMMA_STRIDE + 32 * r + 4 * q;
            const unsigned a0 = *(const unsigned*)a, a1 = *(const unsigned*)(a + 8 * BMMA_STRIDE);
            const unsigned a2 = *(const unsigned*)(a + 16), a3 = *(const unsigned*)(a + 8 * BMMA_STRIDE + 16);
            const int si = W::HALVES ? 2 * r : r;
            const float s0 = wsc[ra * 16 + si], s1 = wsc[(ra + 8) * 16 + si];
            const float u0 = W::HALVES ? wsc[ra * 16 + si + 1] : 0.f, u1 = W::HALVES ? wsc[(ra + 8) * 16 + si + 1] : 0.f;
            const float m0 = W::MINS ? wmn[ra * 8 + r] : 0.f, m1 = W::MINS ? wmn[(ra + 8) * 8 + r] : 0.f;
            #pragma unroll
            for (int j = 0; j < NT / 8; j++) {
                const int bo = (8 * j + g) * BMMA_STRIDE + 32 * r + 4 * q;
                const unsigned bh0 = *(const unsigned*)(xh + bo), bh1 = *(const unsigned*)(xh + bo + 16);
                const unsigned bl0 = *(const unsigned*)(xl + bo), bl1 = *(const unsigned*)(xl + bo + 16);
                float v[4];
                if constexpr (W::HALVES) {
                    int ch0[4], ch1[4], cl0[4], cl1[4];
                    bmma_k16(ch0, a0, a1, bh0); bmma_k16(ch1, a2, a3, bh1);
                    bmma_k16(cl0, a0, a1, bl0); bmma_k16(cl1, a2, a3, bl1);
                    for (int i = 0; i < 4; i++)
                        v[i] = (i < 2 ? s0 : s1) * fmaf(254.f, (float)ch0[i], (float)cl0[i])
                             + (i < 2 ? u0 : u1) * fmaf(254.f, (float)ch1[i], (float)cl1[i]);
                } else {
                    int ch[4], cl[4];
                    bmma_k32(ch, a0, a1, a2, a3, bh0, bh1);
                    bmma_k32(cl, a0, a1, a2, a3, bl0, bl1);
                    for (int i = 0; i < 4; i++) v[i] = (i < 2 ? s0 : s1) * fmaf(254.f, (float)ch[i], (float)cl[i]);
                }
                const int t = 8 * j + 2 * q;
                for (int i = 0; i < 4; i++) {
                    const float dx = xds[(t + (i & 1)) * 8 + r];
                    acc[j][i] = fmaf(dx, v[i], acc[j][i]);
                    if (W::MINS) acc[j][i] = fmaf(-(i < 2 ? m0 : m1), xss[(t + (i & 1)) * 8 + r], acc[j][i]);
                }
            }
        }
    }
    for (int j = 0; j < NT / 8; j++)
        for (int i = 0; i < 4; i++) {
            const int t = t0 + 8 * j + 2 * q + (i & 1), row = r0 + warp * 16 + g + 8 * (i >> 1);
            if (t < n && row < rows) out[(long long)t * rows + row] = acc[j][i];
        }
}
