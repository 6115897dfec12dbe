"""A decode-time expert cache kept entirely on the device (--experts host, issue 6).

Why: with the experts in host RAM, the host-managed cache (lite/experts.py ExpertCache through
cuda_host_experts.HostExperts) must read each layer's routed ids on the host (one sync a layer),
run the cache's Python and launch the layer's kernels one by one: a decode step could not be
captured in a CUDA graph, and 48 syncs and ~30 eager launches a layer held 30B-A3B decode at ~25
tok/s whatever the hit rate (97% hits at a 50% cache, ~20 tok/s with no cache at all).

Here the cache's bookkeeping is one small kernel a layer and the misses' copies a second one, both
reading their inputs on the device, so a decode step has no host round trip and is captured in the
stage's decode graph with the rest of the model:

  xc_step   one CTA of 512 threads (n_expert <= 512). Marks the routed experts of this call (ids
            on the device, any T <= 8 tokens x k), stamps the hits' slots with a new tick (clock,
            a device counter), and gives each miss (ascending expert order) the least recently
            stamped slot not stamped this tick (ties: the lower slot; free slots first), updating
            the (layer, expert) -> slot table, the slot -> key table and a fetch list
            [count, slot0, expert0, slot1, expert1, ...]; counts hits, misses and calls.
  xc_fetch  copies each listed miss's gate, up and down bytes straight from the pinned host
            copies (host pointers are device-addressable under UVA: cudaHostAlloc memory) into its
            slot; blocks beyond the list's count exit at once, so a step with no miss costs two
            launches of idle blocks (a few microseconds inside a graph).

The grouped pairs path (moe_mv) then reads the slots through the layer's row of the table (its
slot_of): each output row is computed on its own from the same bytes as when resident, so outputs
are byte-identical whatever the cache holds. `step_ref` is the NumPy twin (the contract; CPU tests
run the cache on it and GPU tests compare the kernel with it).

Slots here are apart from the host-managed cache's (which serves prefill chunks: they route to
nearly every expert and are better served by whole layers), so the two never disagree about what
a slot holds.
"""
import functools

import numpy as np

XC_THREADS = 512                 # xc_step's CTA; also the most experts a layer may have
FETCH_BLOCKS = 32                # xc_fetch blocks along an expert's bytes (per miss and kind)

C_XC = r"""
typedef unsigned long long u64;

extern "C" __global__ void __launch_bounds__(512) xc_step(
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
extern "C" __global__ void __launch_bounds__(256) xc_fetch(
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
"""


def step_ref(ids, row, n_expert, table, key, stamp, clock, fetch, counters):
    """NumPy twin of xc_step (the contract), in place on NumPy arrays: table (rows, n_expert),
    key/stamp (n_dev,), clock (1,), fetch (1 + 2 * max misses,), counters (3,) uint64."""
    v = np.asarray(ids).reshape(-1)
    need = np.zeros(n_expert, bool)
    need[v[(v >= 0) & (v < n_expert)]] = True
    t = int(clock[0]) + 1
    clock[0] = t
    trow = table[row]
    miss = []
    for e in np.flatnonzero(need):
        s = trow[e]
        if s >= 0:
            stamp[s] = t
        else:
            miss.append(int(e))
    for j, e in enumerate(miss):
        cand = np.flatnonzero(stamp != t)
        s = int(cand[np.argmin(stamp[cand])])          # first minimum: the lower slot
        old = int(key[s])
        if old >= 0:
            table.reshape(-1)[old] = -1
        key[s] = row * n_expert + e
        trow[e] = s
        stamp[s] = t
        fetch[1 + 2 * j] = s
        fetch[2 + 2 * j] = e
    fetch[0] = len(miss)
    counters[0] += np.uint64(int(need.sum()) - len(miss))
    counters[1] += np.uint64(len(miss))
    counters[2] += np.uint64(1)
    return miss


@functools.lru_cache(maxsize=None)
def _module(device):
    import cupy
    return cupy.RawModule(code=C_XC, options=("--std=c++17",))


class DeviceExpertCache:
    """n_dev slots of one pool layout on the device, managed by xc_step. layers: the pool's layers
    (a table row each); ebytes: bytes of one expert of gate, up, down; src_ptr(layer, kind) -> a
    device-addressable pointer to that layer's tensor in pinned host RAM. launch: None for the
    CUDA kernels, else a (step, fetch) pair with step_ref's and fetch_ref's signatures (the CPU
    tests' NumPy twins)."""

    def __init__(self, cp, n_dev, layers, n_expert, ebytes, src_ptr, max_ids, launch=None):
        if n_expert > XC_THREADS:
            raise ValueError(f"device expert cache: {n_expert} experts (at most {XC_THREADS})")
        if n_dev < max_ids:
            raise ValueError(f"device expert cache: {n_dev} slots for up to {max_ids} routed experts")
        self.cp, self.n_dev, self.n_expert, self.ebytes = cp, n_dev, n_expert, list(ebytes)
        self.max_ids = max_ids
        self.row = {il: i for i, il in enumerate(sorted(layers))}
        self.bufs = [cp.empty(n_dev * eb, np.uint8) for eb in self.ebytes]
        self.table = self._full((len(self.row), n_expert), -1)
        self.key = self._full((n_dev,), -1)
        self.stamp = self._full((n_dev,), -1)
        self.clock = self._full((1,), 0)
        self.fetch = self._full((1 + 2 * max_ids,), 0)
        self.counters = cp.zeros(3, np.uint64)
        self._src = {il: [int(src_ptr(il, k)) for k in range(3)] for il in self.row}
        self._launch = launch
        self.calls = 0                   # step() calls from Python (replays of a graph not counted)

    def _full(self, shape, v):
        a = self.cp.empty(int(np.prod(shape)), np.int32).reshape(shape)
        a[...] = v
        return a

    def slot_of(self, il):
        """The layer's expert -> slot array (-1: not resident), the grouped kernels' slot_of."""
        return self.table[self.row[il]]

    def step(self, ids, il, stream=None):
        """Make layer il's routed experts (ids: device int32, any shape, <= max_ids entries)
        resident: bookkeeping and copies on the device, in stream order; no host sync."""
        n_ids = int(np.prod(ids.shape))
        if n_ids > self.max_ids:
            raise ValueError(f"device expert cache: {n_ids} routed experts (at most {self.max_ids})")
        row = self.row[il]
        self.calls += 1
        s, (eg, eu, ed) = self._src[il], self.ebytes
        if self._launch is not None:
            step, fetch = self._launch
            step(ids, row, self.n_expert, self.table, self.key, self.stamp, self.clock, self.fetch, self.counters)
            fetch(self.fetch, s, self.ebytes, self.bufs, n_ids)
            return
        i32 = np.int32
        mod = _module(self.cp.cuda.runtime.getDevice())
        mod.get_function("xc_step")((1,), (XC_THREADS,), (
            ids, i32(n_ids), i32(row), i32(self.n_expert), self.table, self.key, self.stamp, self.clock,
            i32(self.n_dev), self.fetch, self.counters))
        u64 = np.uint64
        mod.get_function("xc_fetch")((FETCH_BLOCKS, n_ids, 3), (256,), (
            self.fetch, u64(s[0]), u64(s[1]), u64(s[2]), np.int64(eg), np.int64(eu), np.int64(ed),
            self.bufs[0], self.bufs[1], self.bufs[2]))

    def stats(self):
        """hits, misses, steps (kernel calls, graph replays included), bytes streamed: one small
        device-to-host read (call outside the hot path)."""
        c = self.counters
        c = c.get() if hasattr(c, "get") else np.asarray(c)
        hits, misses, steps = (int(x) for x in c)
        return {"hits": hits, "misses": misses, "steps": steps, "bytes_streamed": misses * sum(self.ebytes)}

    def contents(self):
        """{(layer, expert): slot} as the device tables say (tests)."""
        key = self.key.get() if hasattr(self.key, "get") else np.asarray(self.key)
        layers = sorted(self.row, key=self.row.get)
        return {(layers[int(k) // self.n_expert], int(k) % self.n_expert): s for s, k in enumerate(key) if k >= 0}


def fetch_ref(fetch_list, src, ebytes, bufs, n_ids):
    """The NumPy twin of xc_fetch (CPU tests, where the "device" is host memory and src holds the
    pinned copies' host addresses): each listed miss's bytes into its slot."""
    import ctypes
    for j in range(int(fetch_list[0])):
        slot, e = int(fetch_list[1 + 2 * j]), int(fetch_list[2 + 2 * j])
        for k, eb in enumerate(ebytes):
            ctypes.memmove(bufs[k].ctypes.data + slot * eb, src[k] + e * eb, eb)
