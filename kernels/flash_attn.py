"""Prefill attention in one pass (flash attention) on tensor cores, CUDA C through CuPy.

NOT YET RUN ON A GPU: written when session 1's device time was spent (it compiles with nvcc for
sm_90). The CUDA backend uses it only with LITE_FLASH_ATTN=1; tests/test_cuda_backend.py compares
it with the materialized path on the GPU. Why it matters: the materialized path writes and reads a
(G*T, S) fp32 score block and an fp16 probability block per KV head, which at 32K context costs more
than the matrix products (pp32768: 7,100 tok/s against llama.cpp's 8,624, BENCHMARKS.md).

One CTA = 64 query rows of one head, 4 warps of 16 rows. For each tile of 32 keys (causal and
sliding-window ranges only): S = Q K^T with wmma (fp16 in, fp32 out) into shared memory, an online
softmax by lane pairs (lane 2r and 2r+1 own row r), P (fp16) V with wmma into shared memory, and
O = O * alpha + PV in registers. Shapes: q (T, H, D) f32, K/V caches (Hkv, S_max, D) f16, out
(T, H, Dv) f32; D and Dv are 64 or 128.
"""
import numpy as np

_SRC = r"""
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;
#define BM 64
#define BN 32
#define NEG_INF (-__int_as_float(0x7f800000))

extern "C" __global__ void flash_fwd(const float* __restrict__ q, const __half* __restrict__ K,
        const __half* __restrict__ V, float* __restrict__ out, int T, int H, int Hkv, int S_max,
        long long pos0, int window, float scale) {
    extern __shared__ __align__(32) unsigned char smem[];
    __half* Qs = (__half*)smem;                                  // BM x D
    __half* Ks = Qs + BM * D;                                    // BN x D
    __half* Vs = Ks + BN * D;                                    // BN x DV
    float* Sf = (float*)(Vs + BN * DV);                          // 4 warps x 16 x BN
    __half* Ph = (__half*)(Sf + 4 * 16 * BN);                    // 4 warps x 16 x BN
    float* PVf = (float*)(Ph + 4 * 16 * BN);                     // 4 warps x 16 x DV
    const int h = blockIdx.y, hk = h / (H / Hkv);
    const int t0 = blockIdx.x * BM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long S = pos0 + T;

    for (int i = tid; i < BM * D; i += blockDim.x) {             // Q tile, fp32 -> fp16
        int r = i / D, d = i % D, t = t0 + r;
        Qs[i] = __float2half(t < T ? q[((long long)t * H + h) * D + d] : 0.f);
    }
    const int row = lane >> 1, side = lane & 1;                  // this lane's row and half
    const int t = t0 + warp * 16 + row;
    const long long qp = pos0 + t;                               // its position
    float m = NEG_INF, l = 0.f, o[DV / 2];
    #pragma unroll
    for (int i = 0; i < DV / 2; ++i) o[i] = 0.f;

    int t_last = min(T, t0 + BM) - 1;
    long long k_end = min(S, pos0 + t_last + 1);
    long long k_begin = window > 0 ? max(0LL, pos0 + t0 - window + 1) : 0;
    k_begin -= k_begin % BN;
    const __half* Kh = K + (long long)hk * S_max * D;
    const __half* Vh = V + (long long)hk * S_max * DV;
    float* Sw = Sf + warp * 16 * BN;
    __half* Pw = Ph + warp * 16 * BN;
    float* PVw = PVf + warp * 16 * DV;

    for (long long kt = k_begin; kt < k_end; kt += BN) {
        __syncthreads();                                         // the last tile is consumed
        for (int i = tid; i < BN * D / 8; i += blockDim.x) {     // K, V tiles, 16-byte loads
            int r = (i * 8) / D, c = (i * 8) % D;
            long long j = kt + r;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (j < S) v = *reinterpret_cast<const uint4*>(Kh + j * D + c);
            *reinterpret_cast<uint4*>(Ks + r * D + c) = v;
        }
        for (int i = tid; i < BN * DV / 8; i += blockDim.x) {
            int r = (i * 8) / DV, c = (i * 8) % DV;
            long long j = kt + r;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (j < S) v = *reinterpret_cast<const uint4*>(Vh + j * DV + c);
            *reinterpret_cast<uint4*>(Vs + r * DV + c) = v;
        }
        __syncthreads();
        // S (16 x BN) = Q (16 x D) K^T: K's rows in shared memory are K^T's columns
        #pragma unroll
        for (int n = 0; n < BN / 16; ++n) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            wmma::fill_fragment(c, 0.f);
            #pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
                wmma::load_matrix_sync(a, Qs + warp * 16 * D + kk * 16, D);
                wmma::load_matrix_sync(b, Ks + n * 16 * D + kk * 16, D);
                wmma::mma_sync(c, a, b, c);
            }
            wmma::store_matrix_sync(Sw + n * 16, c, BN, wmma::mem_row_major);
        }
        __syncwarp();
        // online softmax: this lane's BN/2 columns of its row
        float s[BN / 2], mx = NEG_INF;
        #pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            int col = side * (BN / 2) + i;
            long long j = kt + col;
            bool masked = t >= T || j >= S || j > qp || (window > 0 && qp - j >= window);
            s[i] = masked ? NEG_INF : Sw[row * BN + col] * scale;
            mx = fmaxf(mx, s[i]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        float m_new = fmaxf(m, mx);
        float alpha = (m_new == NEG_INF) ? 1.f : __expf(m - m_new);
        float sum = 0.f;
        #pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            float p = (m_new == NEG_INF) ? 0.f : __expf(s[i] - m_new);
            sum += p;
            Pw[row * BN + side * (BN / 2) + i] = __float2half(p);
        }
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        __syncwarp();
        // PV (16 x DV) = P (16 x BN) V (BN x DV)
        #pragma unroll
        for (int n = 0; n < DV / 16; ++n) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            wmma::fill_fragment(c, 0.f);
            #pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
                wmma::load_matrix_sync(a, Pw + kk * 16, BN);
                wmma::load_matrix_sync(b, Vs + kk * 16 * DV + n * 16, DV);
                wmma::mma_sync(c, a, b, c);
            }
            wmma::store_matrix_sync(PVw + n * 16, c, DV, wmma::mem_row_major);
        }
        __syncwarp();
        #pragma unroll
        for (int i = 0; i < DV / 2; ++i) o[i] = o[i] * alpha + PVw[row * DV + side * (DV / 2) + i];
    }
    if (t < T) {
        float inv = l > 0.f ? 1.f / l : 0.f;
        float* dst = out + ((long long)t * H + h) * DV + side * (DV / 2);
        #pragma unroll
        for (int i = 0; i < DV / 2; ++i) dst[i] = o[i] * inv;
    }
}
"""

THREADS = 128
BM, BN = 64, 32
_kernels = {}


def source(D, Dv):
    return f"#define D {D}\n#define DV {Dv}\n" + _SRC


def smem_bytes(D, Dv):
    return (BM * D + BN * D + BN * Dv) * 2 + 4 * 16 * BN * 4 + 4 * 16 * BN * 2 + 4 * 16 * Dv * 4


def supported(D, Dv):
    return D in (64, 128) and Dv in (64, 128)


def _kernel(D, Dv):
    import cupy as cp
    key = (cp.cuda.Device().id, D, Dv)
    if key not in _kernels:
        k = cp.RawKernel(source(D, Dv), "flash_fwd", options=("--std=c++17",))
        k.max_dynamic_shared_size_bytes = smem_bytes(D, Dv)
        _kernels[key] = k
    return _kernels[key]


def flash_prefill(q, K, V, pos0, window, scale, stream):
    """q (T, H, D) f32 against the f16 caches K (Hkv, S_max, D), V (Hkv, S_max, Dv), causal from
    position pos0 (and a sliding window when window > 0) -> (T, H, Dv) f32."""
    import cupy as cp
    T, H, D = q.shape
    Hkv, S_max, Dv = V.shape
    if not supported(D, Dv):
        raise ValueError(f"flash prefill supports head dims 64 and 128, got {D}/{Dv}")
    out = cp.empty((T, H, Dv), np.float32)
    grid = (-(-T // BM), H)
    _kernel(D, Dv)(grid, (THREADS,), (cp.ascontiguousarray(q), K, V, out, np.int32(T), np.int32(H),
                                       np.int32(Hkv), np.int32(S_max), np.int64(pos0),
                                       np.int32(window), np.float32(scale)),
                   shared_mem=smem_bytes(D, Dv), stream=stream)
    return out
