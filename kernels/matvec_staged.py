"""Two alternatives to the register decode kernel `mv` of kernels/matvec_cuda.py (CUDA C):

  - mvs, *staged*: a CTA copies whole row segments (R rows x 128 chunks, a stage) into shared
    memory with 16-byte cp.async, S stages deep, and computes from there; persistent grid (as many
    CTAs as fit, each walking row groups blockIdx.x, +gridDim.x, ...) so the copy pipeline also
    runs across row groups. Needs 16-byte aligned blocks and rows of a multiple of 16 bytes.
  - mvp, *persistent register prefetch*: `mv`'s loop on the same persistent grid, loading the next
    item (row group, trip) into registers before computing this one, across row groups too.

Used with the per-type structs of matvec_cuda.C_TYPES (and TIQ3_XXS of matvec_iq.py), so the same
arithmetic as `mv` and the same Numba twins. Why they exist: `mv` keeps only one loop trip of loads
in flight per thread (3-4 trips a row group), so its time looked like memory time plus compute
time; these overlap the two. Measured on the H200 (tests/gpu_sweep_matvec.py, n=1, weights
rotated past the L2), they did NOT beat `mv` for Q4_0/Q8_0/Q4_K/Q5_K/Q6_K: 4096x14336 Q4_K
1,837 GB/s for mv, 1,491 mvs<8 rows, 3 stages>, 1,625 mvp<4 rows>; Q8_0 2,811 / 1,799 / 2,204
(mvp<8>: 2,336); the grid caps were as computed (occupancy is not what lost). So the kernels are
bound by instructions and latency more than by loads in flight, and more CTAs (hardware
scheduling) beat software pipelining. mvp<8 rows> is the default for IQ3_XXS only (569 -> 689
GB/s). Kept, opt-in through the configs of matvec_cuda.launch / matvec_iq.launch_cuda, as
measured variants.
"""
import functools

THREADS = 128
SMEM_PAD = 16   # loaders of 2-aligned blocks read up to 4 bytes past a block: keep that in bounds

C_STAGED = r"""
__device__ __forceinline__ unsigned lt_smem_addr(const void* p) {
    unsigned s;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(p));
    return s;
}
__device__ __forceinline__ void lt_cp16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(lt_smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void lt_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int K> __device__ __forceinline__ void lt_cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(K) : "memory"); }

// out (N, rows) = x (N, cols) @ W.T; a CTA of 128 threads owns R rows at a time; S stages.
template <class T, int N, int R, int S>
__global__ void __launch_bounds__(128) mvs(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                           float* __restrict__ out, int rows, int cols) {
    constexpr int SEG = 128 / T::CPB * T::TS;        // bytes of one row a trip reads (128 chunks)
    extern __shared__ uint4 lt_stage_mem[];
    unsigned char* const st = (unsigned char*)lt_stage_mem;
    T::init();                                       // per-type tables in shared memory (IQ grids)
    const int nb = cols / T::BE, chunks = nb * T::CPB, trips = (chunks + 127) >> 7;
    const long long rb = (long long)nb * T::TS;
    const int groups = (rows + R - 1) / R, tid = threadIdx.x;
    // Item i of this CTA: row group blockIdx.x + (i / trips) * gridDim.x, trip i % trips.
    const int items = (int)blockIdx.x < groups ? ((groups - 1 - (int)blockIdx.x) / (int)gridDim.x + 1) * trips : 0;
    // Copies item i into stage i % S. Always commits (an empty group past the end), so that after
    // the commit of item i + S - 1, waiting for all but S - 2 groups means item i has landed.
    auto issue = [&](int i) {
        if (i < items) {
            const int g = blockIdx.x + (i / trips) * gridDim.x;
            const long long off = (long long)(i % trips) * SEG;
            const int bytes = (int)min((long long)SEG, rb - off);
            unsigned char* dst = st + (i % S) * (R * SEG);
            #pragma unroll
            for (int r = 0; r < R; r++) {    // rows past the end copy the last row; never written
                const unsigned char* src = w + (long long)min(g * R + r, rows - 1) * rb + off;
                for (int o = tid * 16; o < bytes; o += 128 * 16) lt_cp16(dst + r * SEG + o, src + o);
            }
        }
        lt_cp_commit();
    };
    #pragma unroll
    for (int s = 0; s < S - 1; s++) issue(s);
    float acc[R][N];
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    __shared__ float red[4][R * N];
    int t = 0, g = blockIdx.x;                       // trip and row group of item i
    for (int i = 0; i < items; i++) {
        lt_cp_wait<S - 2>();
        // every thread's copies of item i are in, and every thread is done reading item i - 1,
        // whose stage the next issue overwrites
        __syncthreads();
        issue(i + S - 1);
        const int c = t * 128 + tid;
        if (c < chunks) {
            const unsigned char* seg = st + (i % S) * (R * SEG);
            #pragma unroll
            for (int n = 0; n < N; n++) {
                float4 xv[8];
                float xa, xb;
                load_x<T>(x + (long long)n * cols, c, xv, xa, xb);
                #pragma unroll
                for (int r = 0; r < R; r++) {   // chunk tid of the stage: blocks are whole in a stage
                    typename T::Raw raw;
                    T::template load<true>(raw, seg + r * SEG, tid);
                    acc[r][n] += T::dot(raw, c, xv, xa, xb);
                }
            }
        }
        if (++t == trips) {                          // row group done: warp sums, then across warps
            const float total = block_sum<R, N>(acc, red);
            #pragma unroll
            for (int r = 0; r < R; r++)
                #pragma unroll
                for (int n = 0; n < N; n++) acc[r][n] = 0.f;
            if (tid < R * N) {   // red is rewritten only after the next item's __syncthreads
                const int r = tid / N, n = tid % N;
                if (g * R + r < rows) out[(long long)n * rows + g * R + r] = total;
            }
            t = 0;
            g += gridDim.x;
        }
    }
}
"""


C_PERSISTENT = r"""
// The register kernel's loop (matvec_cuda.py `mv`) made persistent: a CTA walks row groups
// blockIdx.x, +gridDim.x, ... and loads the next item (row group, trip) into registers before
// computing this one, across row-group boundaries too, so loads stay in flight between groups.
template <class T, int N, int R>
__global__ void __launch_bounds__(128) mvp(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                           float* __restrict__ out, int rows, int cols) {
    T::init();
    const int nb = cols / T::BE, chunks = nb * T::CPB, trips = (chunks + 127) >> 7;
    const long long rb = (long long)nb * T::TS;
    const int groups = (rows + R - 1) / R, tid = threadIdx.x;
    const int items = (int)blockIdx.x < groups ? ((groups - 1 - (int)blockIdx.x) / (int)gridDim.x + 1) * trips : 0;
    typename T::Raw cur[R], nxt[R];
    auto load_item = [&](typename T::Raw (&raw)[R], int g, int t) {
        const int c = min(t * 128 + tid, chunks - 1);   // idle threads load a valid chunk, unused
        #pragma unroll
        for (int r = 0; r < R; r++) T::load(raw[r], w + (long long)min(g * R + r, rows - 1) * rb, c);
    };
    float acc[R][N];
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    __shared__ float red[2][4][R * N];   // by row-group parity: a group's writes never meet the last one's reads
    int t = 0, g = blockIdx.x, done = 0;
    if (items > 0) load_item(cur, g, 0);
    for (int i = 0; i < items; i++) {
        int tn = t + 1, gn = g;
        if (tn == trips) { tn = 0; gn += gridDim.x; }
        if (i + 1 < items) load_item(nxt, gn, tn);
        const int c = t * 128 + tid;
        if (c < chunks) {
            #pragma unroll
            for (int n = 0; n < N; n++) {
                float4 xv[8];
                float xa, xb;
                load_x<T>(x + (long long)n * cols, c, xv, xa, xb);
                #pragma unroll
                for (int r = 0; r < R; r++) acc[r][n] += T::dot(cur[r], c, xv, xa, xb);
            }
        }
        if (tn == 0) {                                   // row group g done
            const float total = block_sum<R, N>(acc, red[done & 1]);
            #pragma unroll
            for (int r = 0; r < R; r++)
                #pragma unroll
                for (int n = 0; n < N; n++) acc[r][n] = 0.f;
            if (tid < R * N) {
                const int r = tid / N, n = tid % N;
                if (g * R + r < rows) out[(long long)n * rows + g * R + r] = total;
            }
            done++;
        }
        #pragma unroll
        for (int r = 0; r < R; r++) cur[r] = nxt[r];
        t = tn;
        g = gn;
    }
}
"""


def kernel_name(struct, n, rows_per_cta, stages):
    return f"mvs<{struct}, {n}, {rows_per_cta}, {stages}>"


def persistent_name(struct, n, rows_per_cta):
    return f"mvp<{struct}, {n}, {rows_per_cta}>"


def seg_bytes(type_size, chunks_per_block):
    """Bytes of one row that one stage holds: 128 chunks of 32 weights."""
    return THREADS // chunks_per_block * type_size


def smem_bytes(type_size, chunks_per_block, rows_per_cta, stages):
    return stages * rows_per_cta * seg_bytes(type_size, chunks_per_block) + SMEM_PAD


def qualifies(ptr, row_bytes):
    """Stages are copied 16 bytes at a time: blocks and every row must start 16-aligned."""
    return ptr % 16 == 0 and row_bytes % 16 == 0


def _blocks_per_sm(func, smem, device):
    import cupy
    try:
        return max(1, cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(func.ptr, THREADS, smem))
    except Exception:   # noqa: BLE001 - no such call in this CuPy: registers and shared memory bound it
        props = cupy.cuda.runtime.getDeviceProperties(device)
        by_smem = props.get("sharedMemPerMultiprocessor", 233472) // (smem + func.shared_size_bytes + 1024)
        regs = -(-func.num_regs * 32 // 256) * 256 * (THREADS // 32)
        return max(1, min(by_smem, 65536 // max(regs, 1), 2048 // THREADS))


@functools.lru_cache(maxsize=None)
def prepare(func, smem, device):
    """Allows `func` its dynamic shared memory; returns the persistent grid's size cap (CTAs that
    fit on the device at once)."""
    import cupy
    if smem > 48 * 1024:
        func.max_dynamic_shared_size_bytes = smem
    if smem:   # ask for the largest shared-memory carveout, or fewer CTAs than computed may fit
        func.preferred_shared_memory_carveout = 100
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    return sms * _blocks_per_sm(func, smem, device)


def launch(func, smem, device, rows, rows_per_cta, args):
    """Enqueue one staged (mvs) or persistent (mvp, smem 0) kernel on the current CuPy stream."""
    cap = prepare(func, smem, device)
    grid = max(1, min(-(-rows // rows_per_cta), cap))
    func((grid,), (THREADS,), args, shared_mem=smem)
