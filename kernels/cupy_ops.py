"""Small per-token kernels as CuPy RawKernels: RMSNorm, RoPE, the masked softmax of attention.

These are launched many times per layer, and a CuPy RawKernel launch costs ~6-8 us of host time
against ~50-200 us for a Numba launch (shared device notes), so the non-quantized glue is written
here in CUDA C. They need a GPU (no simulator path); tests check them against the CPU backend on
the GPU machine. Every wrapper takes the CuPy stream to launch on and never synchronizes.
"""
import math

import cupy as cp
import numpy as np

_SRC = r"""
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
    // one block per row; the weight broadcasts over rows (n values)
    const float* xr = x + (long long)blockIdx.x * n;
    float* yr = y + (long long)blockIdx.x * n;
    __shared__ float part[32];
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { float v = xr[i]; s += v * v; }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
        if (threadIdx.x == 0) part[0] = s;
    }
    __syncthreads();
    float r = rsqrtf(part[0] / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}

extern "C" __global__ void rope(const float* x, float* y, int T, int H, int D, int n_rot,
                                long long pos0, double base, double freq_scale, int neox) {
    // one thread per rotated pair; angles in double so long positions keep their precision
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int half = n_rot / 2;
    long long total = (long long)T * H * half;
    if (idx >= total) return;
    int i = idx % half;
    long long th = idx / half;           // t * H + h
    int t = th / H;
    const float* xr = x + th * D;
    float* yr = y + th * D;
    double ang = (double)(pos0 + t) * freq_scale * pow(base, -2.0 * i / n_rot);
    float c = (float)cos(ang), s = (float)sin(ang);
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float xa = xr[a], xb = xr[b];
    yr[a] = xa * c - xb * s;
    yr[b] = xa * s + xb * c;
    if (i == 0) for (int j = n_rot; j < D; ++j) yr[j] = xr[j];
}

extern "C" __global__ void masked_softmax(float* s, int rows, int S, int T, long long pos0,
                                          int window, float scale) {
    // s: (G, T, S) scores of one KV head, rows = G*T; row r is query t = r % T at pos0 + t.
    // Causal mask (and the sliding window), scale, softmax, in place. One block per row.
    int r = blockIdx.x;
    long long qpos = pos0 + (r % T);
    float* row = s + (long long)r * S;
    __shared__ float red[32];
    float m = -INFINITY;
    for (int j = threadIdx.x; j < S; j += blockDim.x) {
        bool masked = j > qpos || (window > 0 && qpos - j >= window);
        float v = masked ? -INFINITY : row[j] * scale;
        row[j] = v;
        m = fmaxf(m, v);
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
        if (threadIdx.x == 0) red[0] = m;
    }
    __syncthreads();
    m = red[0];
    __syncthreads();
    float sum = 0.f;
    for (int j = threadIdx.x; j < S; j += blockDim.x) {
        float e = __expf(row[j] - m);
        row[j] = e;
        sum += e;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        sum = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
        if (threadIdx.x == 0) red[0] = sum;
    }
    __syncthreads();
    float inv = 1.f / red[0];
    for (int j = threadIdx.x; j < S; j += blockDim.x) row[j] *= inv;
}
"""
_module = None


def _kernel(name):
    global _module
    if _module is None:
        _module = cp.RawModule(code=_SRC, options=("--std=c++17",))
    return _module.get_function(name)


def rms_norm(x, w, eps, stream):
    """x (..., n) f32 contiguous, w (n,) f32 -> new array."""
    n = x.shape[-1]
    rows = x.size // n
    y = cp.empty_like(x)
    threads = min(1024, max(32, 1 << (n - 1).bit_length()))
    _kernel("rms_norm")((rows,), (threads,), (x, w, y, np.int32(n), np.float32(eps)), stream=stream)
    return y


def rope(x, pos0, base, neox, n_rot, freq_scale, stream):
    """x (T, H, D) f32 contiguous -> rotated copy."""
    T, H, D = x.shape
    y = cp.empty_like(x)
    total = T * H * (n_rot // 2)
    _kernel("rope")((math.ceil(total / 256),), (256,),
                    (x, y, np.int32(T), np.int32(H), np.int32(D), np.int32(n_rot), np.int64(pos0),
                     np.float64(base), np.float64(freq_scale), np.int32(bool(neox))), stream=stream)
    return y


def masked_softmax(scores, T, pos0, window, scale, stream):
    """scores (G, T, S) f32, in place."""
    S = scores.shape[-1]
    rows = scores.size // S
    threads = min(1024, max(32, 1 << (S - 1).bit_length()))
    _kernel("masked_softmax")((rows,), (threads,), (scores, np.int32(rows), np.int32(S), np.int32(T),
                                                    np.int64(pos0), np.int32(window), np.float32(scale)),
                              stream=stream)
    return scores


silu_mul = cp.ElementwiseKernel("float32 g, float32 u", "float32 y",
                                "y = g / (1.0f + expf(-g)) * u", "lite_silu_mul")
gelu_tanh_mul = cp.ElementwiseKernel(
    "float32 g, float32 u", "float32 y",
    "y = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u",
    "lite_gelu_tanh_mul")
