// The copy ceiling of lite bench kernels (kernels/bench.py copy16_bandwidth): 16-byte loads and stores.
extern "C" __global__ void __launch_bounds__(256) copy16(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                         long long n) {
    // grid-stride, 4 independent 16-byte loads in flight a thread before their stores
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        dst[i] = a; dst[i + stride] = b; dst[i + 2 * stride] = c; dst[i + 3 * stride] = d;
    }
    for (; i < n; i += stride) dst[i] = src[i];
}
