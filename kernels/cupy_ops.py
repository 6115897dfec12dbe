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
#define NEG_INF (-__int_as_float(0x7f800000))
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
                                long long pos0, const long long* pos_ptr, double base,
                                double freq_scale, int neox) {
    // pos_ptr (when not null) holds the position on the device, so a captured graph can replay it
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
    if (pos_ptr) pos0 = *pos_ptr;
    double ang = (double)(pos0 + t) * freq_scale * pow(base, -2.0 * i / n_rot);
    float c = (float)cos(ang), s = (float)sin(ang);
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float xa = xr[a], xb = xr[b];
    yr[a] = xa * c - xb * s;
    yr[b] = xa * s + xb * c;
    if (i == 0) for (int j = n_rot; j < D; ++j) yr[j] = xr[j];
}

extern "C" __global__ void masked_softmax(float* s, __half* p16, int rows, int S, int T,
                                          long long pos0, int window, float scale) {
    // p16 (when not null) receives the probabilities as fp16 (rows, S) for a tensor-core P @ V
    // s: (G, T, S) scores of one KV head, rows = G*T; row r is query t = r % T at pos0 + t.
    // Causal mask (and the sliding window), scale, softmax, in place. One block per row.
    int r = blockIdx.x;
    long long qpos = pos0 + (r % T);
    float* row = s + (long long)r * S;
    __shared__ float red[32];
    float m = NEG_INF;
    for (int j = threadIdx.x; j < S; j += blockDim.x) {
        bool masked = j > qpos || (window > 0 && qpos - j >= window);
        float v = masked ? NEG_INF : row[j] * scale;
        row[j] = v;
        m = fmaxf(m, v);
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : NEG_INF;
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
    __half* prow = p16 ? p16 + (long long)r * S : nullptr;
    for (int j = threadIdx.x; j < S; j += blockDim.x) {
        if (prow) prow[j] = __float2half(row[j] * inv); else row[j] *= inv;
    }
}

// --- decode (one query token), position read from the device --------------------------------
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// k (Hkv, D) f32 -> cache (Hkv, S_max, D) at *pos; int8: scale per (head, position) = amax/127.
// One warp per head.
template <typename T> __device__ void kv_store(const float* x, T* cache, float* scales,
                                               const long long* pos_ptr, int D, int S_max) {
    int h = blockIdx.x, lane = threadIdx.x;
    long long pos = *pos_ptr;
    const float* xr = x + (long long)h * D;
    T* dst = cache + ((long long)h * S_max + pos) * D;
    if (scales == nullptr) {
        for (int d = lane; d < D; d += 32) dst[d] = (T)xr[d];
        return;
    }
    float amax = 0.f;
    for (int d = lane; d < D; d += 32) amax = fmaxf(amax, fabsf(xr[d]));
    amax = warp_max(amax);
    float sc = amax / 127.f;
    float inv = sc > 0.f ? 1.f / sc : 1.f;
    for (int d = lane; d < D; d += 32) {
        float q = rintf(xr[d] * inv);
        dst[d] = (T)fminf(fmaxf(q, -127.f), 127.f);
    }
    if (lane == 0) scales[(long long)h * S_max + pos] = sc;
}
extern "C" __global__ void kv_store_f16(const float* x, __half* c, const long long* p, int D, int S)
{ kv_store<__half>(x, c, nullptr, p, D, S); }
extern "C" __global__ void kv_store_i8(const float* x, signed char* c, float* s, const long long* p,
                                       int D, int S)
{ kv_store<signed char>(x, c, s, p, D, S); }

// One query token against keys 0..*pos of its KV head, split over the keys (flash-decoding).
// Block (h, split) takes up to DEC_CHUNK keys: each thread computes whole dot products for its keys
// with 16-byte loads (many loads in flight, no shuffles), the scores sit in shared memory, a block
// reduction gives their max and sum, then each thread accumulates one output dim over the keys
// (V rows read coalesced). It writes its partial max, sum and weighted V; attn_combine merges the
// splits. The grid is fixed by S_max, so a captured graph serves any position; splits past the
// position write an empty partial.
#define DEC_CHUNK 256
__device__ __forceinline__ void load8(const __half* p, float* f) {
    uint4 u = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&u);
    for (int i = 0; i < 4; ++i) { float2 v = __half22float2(h[i]); f[2 * i] = v.x; f[2 * i + 1] = v.y; }
}
__device__ __forceinline__ void load8(const signed char* p, float* f) {
    uint2 u = *reinterpret_cast<const uint2*>(p);
    const signed char* c = reinterpret_cast<const signed char*>(&u);
    for (int i = 0; i < 8; ++i) f[i] = (float)c[i];
}
__device__ float block_reduce(float v, float* red, bool is_max) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffff, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < nw; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
    return r;
}
template <typename T> __device__ void attn_decode(
        const float* q, const T* K, const T* V, const float* ks, const float* vs,
        float* pm, float* pl, float* pacc, const long long* pos_ptr, int H, int Hkv, int D,
        int Dv, int S_max, float scale, int window, int chunk) {
    __shared__ float qs[256];
    __shared__ float sc[DEC_CHUNK];
    __shared__ float red[32];
    int h = blockIdx.x, hk = h / (H / Hkv), split = blockIdx.y, ns = gridDim.y;
    long long qpos = *pos_ptr;
    long long j0 = window > 0 ? max(0LL, qpos - window + 1) : 0;
    long long lo = max(j0, (long long)split * chunk), hi = min(qpos + 1, (long long)(split + 1) * chunk);
    int n = (int)max(0LL, hi - lo);
    long long slot = (long long)h * ns + split;
    if (n == 0) {
        if (threadIdx.x == 0) { pm[slot] = NEG_INF; pl[slot] = 0.f; }
        for (int d = threadIdx.x; d < Dv; d += blockDim.x) pacc[slot * Dv + d] = 0.f;
        return;
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[(long long)h * D + d];
    __syncthreads();
    const T* Kh = K + ((long long)hk * S_max + lo) * D;
    const float* ksh = ks ? ks + (long long)hk * S_max + lo : nullptr;
    float mloc = NEG_INF;
    for (int jj = threadIdx.x; jj < n; jj += blockDim.x) {
        const T* kr = Kh + (long long)jj * D;
        float s = 0.f, f[8];
        for (int d = 0; d < D; d += 8) {
            load8(kr + d, f);
            for (int i = 0; i < 8; ++i) s = fmaf(qs[d + i], f[i], s);
        }
        if (ksh) s *= ksh[jj];
        s *= scale;
        sc[jj] = s;
        mloc = fmaxf(mloc, s);
    }
    float M = block_reduce(mloc, red, true);
    float lsum = 0.f;
    for (int jj = threadIdx.x; jj < n; jj += blockDim.x) {
        float p = __expf(sc[jj] - M);
        sc[jj] = p;
        lsum += p;
    }
    float L = block_reduce(lsum, red, false);   // its __syncthreads also publishes sc
    const T* Vh = V + ((long long)hk * S_max + lo) * Dv;
    const float* vsh = vs ? vs + (long long)hk * S_max + lo : nullptr;
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float a0 = 0.f, a1 = 0.f;
        int jj = 0;
        for (; jj + 1 < n; jj += 2) {
            float w0 = sc[jj] * (vsh ? vsh[jj] : 1.f), w1 = sc[jj + 1] * (vsh ? vsh[jj + 1] : 1.f);
            a0 = fmaf(w0, (float)Vh[(long long)jj * Dv + d], a0);
            a1 = fmaf(w1, (float)Vh[(long long)(jj + 1) * Dv + d], a1);
        }
        if (jj < n) a0 = fmaf(sc[jj] * (vsh ? vsh[jj] : 1.f), (float)Vh[(long long)jj * Dv + d], a0);
        pacc[slot * Dv + d] = a0 + a1;
    }
    if (threadIdx.x == 0) { pm[slot] = M; pl[slot] = L; }
}
extern "C" __global__ void attn_decode_f16(const float* q, const __half* K, const __half* V,
        float* pm, float* pl, float* pacc, const long long* p, int H, int Hkv, int D, int Dv,
        int S, float scale, int win, int chunk)
{ attn_decode<__half>(q, K, V, nullptr, nullptr, pm, pl, pacc, p, H, Hkv, D, Dv, S, scale, win, chunk); }
extern "C" __global__ void attn_decode_i8(const float* q, const signed char* K, const signed char* V,
        const float* ks, const float* vs, float* pm, float* pl, float* pacc, const long long* p,
        int H, int Hkv, int D, int Dv, int S, float scale, int win, int chunk)
{ attn_decode<signed char>(q, K, V, ks, vs, pm, pl, pacc, p, H, Hkv, D, Dv, S, scale, win, chunk); }

extern "C" __global__ void attn_combine(const float* pm, const float* pl, const float* pacc,
                                        float* out, int ns, int Dv) {
    int h = blockIdx.x;
    const float* m = pm + (long long)h * ns;
    const float* l = pl + (long long)h * ns;
    float M = NEG_INF;
    for (int s = 0; s < ns; ++s) M = fmaxf(M, m[s]);
    float L = 0.f;
    for (int s = 0; s < ns; ++s) if (m[s] != NEG_INF) L += l[s] * __expf(m[s] - M);
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < ns; ++s)
            if (m[s] != NEG_INF) a += pacc[((long long)h * ns + s) * Dv + d] * __expf(m[s] - M);
        out[(long long)h * Dv + d] = a / L;
    }
}
"""
_module = None


def _kernel(name):
    global _module
    if _module is None:
        _module = cp.RawModule(code="#include <cuda_fp16.h>\n" + _SRC, options=("--std=c++17",))
    return _module.get_function(name)


def rms_norm(x, w, eps, stream):
    """x (..., n) f32 contiguous, w (n,) f32 -> new array."""
    n = x.shape[-1]
    rows = x.size // n
    y = cp.empty_like(x)
    threads = min(1024, max(32, 1 << (n - 1).bit_length()))
    _kernel("rms_norm")((rows,), (threads,), (x, w, y, np.int32(n), np.float32(eps)), stream=stream)
    return y


def rope(x, pos0, base, neox, n_rot, freq_scale, stream, pos_dev=None):
    """x (T, H, D) f32 contiguous -> rotated copy; positions from pos_dev (int64 (1,)) if given."""
    T, H, D = x.shape
    y = cp.empty_like(x)
    total = T * H * (n_rot // 2)
    _kernel("rope")((math.ceil(total / 256),), (256,),
                    (x, y, np.int32(T), np.int32(H), np.int32(D), np.int32(n_rot), np.int64(pos0),
                     pos_dev if pos_dev is not None else np.uint64(0), np.float64(base), np.float64(freq_scale), np.int32(bool(neox))), stream=stream)
    return y


def masked_softmax(scores, T, pos0, window, scale, stream, p16=None):
    """scores (..., G*T or T, S) f32 in place; rows r are queries r % T. With p16 (same shape,
    float16) the probabilities go there instead."""
    S = scores.shape[-1]
    rows = scores.size // S
    threads = min(1024, max(32, 1 << (S - 1).bit_length()))
    _kernel("masked_softmax")((rows,), (threads,), (scores, p16 if p16 is not None else np.uint64(0),
                                                    np.int32(rows), np.int32(S), np.int32(T),
                                                    np.int64(pos0), np.int32(window), np.float32(scale)),
                              stream=stream)
    return scores


def kv_store(x, cache, scales, pos_dev, stream):
    """x (Hkv, D) f32 into cache (Hkv, S_max, D) (f16, or int8 with scales (Hkv, S_max)) at *pos_dev."""
    Hkv, S_max, D = cache.shape
    if scales is None:
        _kernel("kv_store_f16")((Hkv,), (32,), (x, cache, pos_dev, np.int32(D), np.int32(S_max)),
                                stream=stream)
    else:
        _kernel("kv_store_i8")((Hkv,), (32,), (x, cache, scales, pos_dev, np.int32(D),
                                               np.int32(S_max)), stream=stream)


DECODE_KEYS_PER_SPLIT = 256     # DEC_CHUNK in the CUDA source: scores of a split live in shared memory
DECODE_THREADS = 128


def attn_decode(q, K, V, ks, vs, pos_dev, scale, window, stream):
    """q (H, D) f32 against cache K (Hkv, S_max, D), V (Hkv, S_max, Dv) up to *pos_dev -> (H, Dv)."""
    H, D = q.shape
    Hkv, S_max, Dv = V.shape
    if D > 256 or D % 8:
        raise ValueError(f"decode attention needs a key head dim that is a multiple of 8 and at "
                         f"most 256, got {D}")
    ns = max(1, -(-S_max // DECODE_KEYS_PER_SPLIT))
    chunk = -(-S_max // ns)
    pm = cp.empty((H, ns), np.float32)
    pl = cp.empty((H, ns), np.float32)
    pacc = cp.empty((H, ns, Dv), np.float32)
    out = cp.empty((H, Dv), np.float32)
    common = (pm, pl, pacc, pos_dev, np.int32(H), np.int32(Hkv), np.int32(D), np.int32(Dv),
              np.int32(S_max), np.float32(scale), np.int32(window), np.int32(chunk))
    grid, block = (H, ns), (DECODE_THREADS,)
    if ks is None:
        _kernel("attn_decode_f16")(grid, block, (q, K, V) + common, stream=stream)
    else:
        _kernel("attn_decode_i8")(grid, block, (q, K, V, ks, vs) + common, stream=stream)
    _kernel("attn_combine")((H,), (128,), (pm, pl, pacc, out, np.int32(ns), np.int32(Dv)),
                            stream=stream)
    return out


silu_mul = cp.ElementwiseKernel("float32 g, float32 u", "float32 y",
                                "y = g / (1.0f + expf(-g)) * u", "lite_silu_mul")
gelu_tanh_mul = cp.ElementwiseKernel(
    "float32 g, float32 u", "float32 y",
    "y = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u",
    "lite_gelu_tanh_mul")
