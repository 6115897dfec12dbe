// The small per-token kernels launched by kernels/small_ops.py: RMSNorm (alone or after the
// residual add), RoPE, the masked softmax of the materialized prefill attention.
#define NEG_INF (-__int_as_float(0x7f800000))
struct SumOp { __device__ float operator()(float a, float b) const { return a + b; } };
struct MaxOp { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
// v combined over the block by op (blockDim.x a multiple of 32, at most 1024; `idle` stands in for
// the warps the block lacks): shuffles in each warp, then the warps' results through red (32
// floats). Every thread gets the result; red may be written again after the next __syncthreads.
template <class Op>
__device__ __forceinline__ float block_reduce(float v, float idle, float* red, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffff, v, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : idle;
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffff, v, o));
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    return red[0];
}
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
    // one block per row; the weight broadcasts over rows (n values)
    const float* xr = x + (long long)blockIdx.x * n;
    float* yr = y + (long long)blockIdx.x * n;
    __shared__ float part[32];
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { float v = xr[i]; s += v * v; }
    float r = rsqrtf(block_reduce(s, 0.f, part, SumOp()) / n + eps);
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
    m = block_reduce(m, NEG_INF, red, MaxOp());
    __syncthreads();                                     // every thread has m before red is reused
    float sum = 0.f;
    for (int j = threadIdx.x; j < S; j += blockDim.x) {
        float e = __expf(row[j] - m);
        row[j] = e;
        sum += e;
    }
    float inv = 1.f / block_reduce(sum, 0.f, red, SumOp());
    __half* prow = p16 ? p16 + (long long)r * S : nullptr;
    for (int j = threadIdx.x; j < S; j += blockDim.x) {
        if (prow) prow[j] = __float2half(row[j] * inv); else row[j] *= inv;
    }
}

extern "C" __global__ void add_rms_norm(const float* a, const float* b, const float* w, float* sum,
                                        float* y, int n, float eps) {
    // sum = a + b (the residual stream) and y = rms_norm(sum) * w in one pass: one block per row
    long long off = (long long)blockIdx.x * n;
    __shared__ float part[32];
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = a[off + i] + b[off + i];
        sum[off + i] = v;
        s += v * v;
    }
    float r = rsqrtf(block_reduce(s, 0.f, part, SumOp()) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[off + i] = sum[off + i] * r * w[i];
}
