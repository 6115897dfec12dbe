"""`mvm` (session 10, written after its device time; never run on a GPU yet: session 11's
`scripts/gpu_first_checks.sh next` times it first): the decode matvec with a CTA's rows copied whole
into shared memory by bulk copies (TMA `cp.async.bulk`, an mbarrier a trip of 128 chunks), every
trip requested at once before the PDL wait, then matvec_cuda's loop over them (T::load<true>).

Why: Nsight Compute (session 10, calls 4 and 8) found IQ3_XXS's product waiting on one trip of
weight loads a thread at a time (48% of a warp's cycles on global loads; the first uses of the
weight words ~28% of the stall samples), and every way of keeping more loads in flight in
registers (prefetch, persistence) cost occupancy or the quantizer's overlap; a plain read of the
same bytes takes half the product's time (Q4_K's: 70%). Here no register holds a load in flight.

Only in modules that name an `mvm<` kernel (matvec_q8._module, the sweep, the emulator tests): the
default modules' text is unchanged.
"""

C_TMA = r"""
// mv over any struct with a shared-memory load (T::load<true>: matvec_q8's integer structs, IQ3_XXS_G4's,
// the K types'), its RR rows of up to MAXB bytes each (static shared memory: RR * MAXB) copied whole,
// in 16-byte multiples (IQ3_XXS_G4: an even number of groups; Q4_K: any): see the module's text.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ unsigned lt_sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void lt_mbar_init(unsigned long long* b, unsigned n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(lt_sa(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void lt_mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void lt_mbar_expect(unsigned long long* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(lt_sa(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void lt_bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(lt_sa(dst)), "l"(src), "r"(bytes), "r"(lt_sa(b)) : "memory");
}
__device__ __forceinline__ void lt_mbar_wait(unsigned long long* b, unsigned phase) {
    asm volatile("{\n\t.reg .pred p;\n\tLT_WAIT%=:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra LT_WAIT%=;\n\t}" :: "r"(lt_sa(b)), "r"(phase) : "memory");
}
#else   // the host emulator: the copy done at once, the barriers empty
#define __align__(n)     // (x86 reads the misaligned words the device would not meet)
inline void lt_mbar_init(unsigned long long*, unsigned) {}
inline void lt_mbar_fence_init() {}
inline void lt_mbar_expect(unsigned long long*, unsigned) {}
inline void lt_bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long*) { std::memcpy(dst, src, bytes); }
inline void lt_mbar_wait(unsigned long long*, unsigned) {}
#endif
template <class T, int N, int RR, int MAXB>
__global__ void __launch_bounds__(128) mvm(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                           float* __restrict__ out, int rows, int cols) {
    constexpr int TRIP = 128 / T::CPB * T::TS, MAXT = (MAXB + TRIP - 1) / TRIP;   // bytes a row and trip
    __shared__ __align__(16) unsigned char rs[RR * MAXB];
    __shared__ __align__(8) unsigned long long bar[MAXT];
    T::init();
    const int row0 = blockIdx.x * RR, nb = cols / T::BE, chunks = nb * T::CPB, rb = nb * T::TS;
    if (threadIdx.x == 0) {       // (the launcher keeps rb <= MAXB and a multiple of 16)
        const int trips = (chunks + 127) >> 7;
        for (int t = 0; t < trips; t++) lt_mbar_init(bar + t, 1);
        lt_mbar_fence_init();
        for (int t = 0; t < trips; t++) {   // weights do not depend on the previous kernel: before its wait
            const int off = t * TRIP, bytes = min(TRIP, rb - off);
            lt_mbar_expect(bar + t, RR * bytes);
            #pragma unroll
            for (int r = 0; r < RR; r++)   // rows past the end copy the last row; never written
                lt_bulk_load(rs + r * rb + off, w + (long long)min(row0 + r, rows - 1) * rb + off, bytes, bar + t);
        }
    }
    __syncthreads();              // the barriers are initialized before anyone waits on them
    PDL_PROLOGUE();
    float acc[RR][N];
    #pragma unroll
    for (int r = 0; r < RR; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    for (int c = threadIdx.x, t = 0; c < chunks; c += 128, t++) {
        lt_mbar_wait(bar + t, 0);
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float4 xv[8];
            float xa, xb;
            load_x<T>(x + (long long)n * cols, c, xv, xa, xb);
            #pragma unroll
            for (int r = 0; r < RR; r++) {
                typename T::Raw raw;
                T::template load<true>(raw, rs + r * rb, c);
                acc[r][n] += T::dot(raw, c, xv, xa, xb);
            }
        }
    }
    __shared__ float red[4][RR * N];
    const float total = block_sum<RR, N>(acc, red);
    if (threadIdx.x < RR * N) {
        const int r = threadIdx.x / N, n = threadIdx.x % N;
        if (row0 + r < rows) out[(long long)n * rows + row0 + r] = total;
    }
}
"""


def wanted(names):
    """True when a module's kernel names include an mvm kernel (then its text needs C_TMA)."""
    return any(n.startswith("mvm<") for n in names)
