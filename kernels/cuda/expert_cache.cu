// The device-managed expert cache's bookkeeping and copies (kernels/expert_cache.py says how).
typedef unsigned long long u64;

extern "C" __global__ void __launch_bounds__(512) expert_cache_step(
        const int* __restrict__ ids, int n_ids, int row, int n_expert,
        int* __restrict__ table, int* __restrict__ key, int* __restrict__ stamp, int* __restrict__ clock,
        int n_dev, int* __restrict__ fetch, u64* __restrict__ counters) {
    __shared__ int need[512];
    __shared__ int miss[512];
    __shared__ int wcount[16];
    __shared__ long long wbest[16];
    __shared__ int s_t, s_nmiss, s_nneed;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    need[tid] = 0;
    __syncthreads();
    for (int i = tid; i < n_ids; i += blockDim.x) {
        const int e = ids[i];
        if (e >= 0 && e < n_expert) need[e] = 1;
    }
    if (tid == 0) { s_t = clock[0] + 1; clock[0] = s_t; }
    __syncthreads();
    const int t = s_t;
    int* trow = table + (long long)row * n_expert;
    bool m = false;
    const bool needed = tid < n_expert && need[tid];
    if (needed) {
        const int s = trow[tid];
        if (s >= 0) stamp[s] = t; else m = true;
    }
    // misses in ascending expert order: a ballot a warp, then the warps' counts in order
    const unsigned ball = __ballot_sync(0xffffffffu, m);
    if (lane == 0) wcount[warp] = __popc(ball);
    const int nneed = __syncthreads_count(needed);
    int before = 0;
    for (int w = 0; w < warp; ++w) before += wcount[w];
    if (m) miss[before + __popc(ball & ((1u << lane) - 1u))] = tid;
    if (tid == 0) {
        int n = 0;
        for (int w = 0; w < 16; ++w) n += wcount[w];
        s_nmiss = n;
        s_nneed = nneed;
    }
    __syncthreads();
    const int nmiss = s_nmiss;
    for (int j = 0; j < nmiss; ++j) {
        // the least recently stamped slot not used this tick (stamp -1: free), lower slot on ties
        long long best = 0x7fffffffffffffffLL;
        for (int s = tid; s < n_dev; s += blockDim.x) {
            const int st = stamp[s];
            if (st != t) {
                const long long v = ((long long)(st + 1) << 32) | (long long)s;
                best = v < best ? v : best;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const long long v = __shfl_xor_sync(0xffffffffu, best, o);
            best = v < best ? v : best;
        }
        if (lane == 0) wbest[warp] = best;
        __syncthreads();
        if (tid == 0) {
            long long b = wbest[0];
            for (int w = 1; w < 16; ++w) b = wbest[w] < b ? wbest[w] : b;
            const int v = (int)(b & 0xffffffffLL);
            const int e = miss[j];
            const int old = key[v];
            if (old >= 0) table[old] = -1;
            key[v] = row * n_expert + e;
            trow[e] = v;
            stamp[v] = t;
            fetch[1 + 2 * j] = v;
            fetch[2 + 2 * j] = e;
        }
        __syncthreads();
    }
    if (tid == 0) {
        fetch[0] = nmiss;
        counters[0] += (u64)(s_nneed - nmiss);
        counters[1] += (u64)nmiss;
        counters[2] += 1ull;
    }
}

// Each listed miss j = blockIdx.y, kind z = blockIdx.z (gate, up, down): its expert's bytes from
// the pinned host copy (a device-addressable host pointer) into its slot.
extern "C" __global__ void __launch_bounds__(256) expert_cache_fetch(
        const int* __restrict__ fetch,
        const unsigned char* __restrict__ src0, const unsigned char* __restrict__ src1,
        const unsigned char* __restrict__ src2, long long eb0, long long eb1, long long eb2,
        unsigned char* __restrict__ dst0, unsigned char* __restrict__ dst1, unsigned char* __restrict__ dst2) {
    const int j = blockIdx.y;
    if (j >= fetch[0]) return;
    const int slot = fetch[1 + 2 * j], e = fetch[2 + 2 * j];
    const int z = blockIdx.z;
    const long long eb = z == 0 ? eb0 : (z == 1 ? eb1 : eb2);
    const unsigned char* s = (z == 0 ? src0 : (z == 1 ? src1 : src2)) + (long long)e * eb;
    unsigned char* d = (z == 0 ? dst0 : (z == 1 ? dst1 : dst2)) + (long long)slot * eb;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((((u64)s | (u64)d | (u64)eb) & 15ull) == 0) {
        const uint4* s4 = (const uint4*)s;
        uint4* d4 = (uint4*)d;
        const long long n = eb >> 4;
        long long i = i0;
        for (; i + 3 * stride < n; i += 4 * stride) {      // four loads in flight a thread
            const uint4 a = s4[i], b = s4[i + stride], c = s4[i + 2 * stride], q = s4[i + 3 * stride];
            d4[i] = a; d4[i + stride] = b; d4[i + 2 * stride] = c; d4[i + 3 * stride] = q;
        }
        for (; i < n; i += stride) d4[i] = s4[i];
    } else {
        for (long long i = i0; i < eb; i += stride) d[i] = s[i];
    }
}
