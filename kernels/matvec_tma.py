"""The decode matvec with a CTA's rows copied whole into shared memory by bulk copies (TMA
`cp.async.bulk`, an mbarrier a trip of 128 chunks and team), every trip requested at once before the
PDL wait, then matvec_cuda's loop over them (T::load<true>): `mvt` (session 11; sweep and tests only).

Why it was tried: Nsight Compute (session 10) found IQ3_XXS's product (mv_iq2) waiting on one trip
of weight loads at a time; here no register holds a load in flight. What it found (H200, session 11,
BENCHMARKS "Session 11"; 4096x14336 IQ3_XXS_G4, us with the quantizer / alone):
- It loses: 16.7 / 14.3 against mv_iq2's 13.2 / 13.0 (session 10's mvm, the rows in static shared
  memory, several CTAs an SM: 15.8 / 12.6; deleted, mvt covers it).
- Its loads are hidden completely (scripts/mvt_timeline.py, D = 3): the CTAs issue every copy within
  0.6 us of entering, wait ~4 us at the PDL wait (the previous kernel's tail, qx, its flush), and
  find each trip landed before they reach it; the ~9 us after the wait are compute. Its compute
  alone (D = 1) takes 9.6-9.8 us: above the 60% bar (9.6) by itself. Nsight Compute: issue 59%,
  fixed-latency waits and the math pipe (dp4a, IMAD) bind, not shared memory (more grid copies,
  conflict-free, are only slower).
- Corrected in session 12: D = 1 computes over shared memory nobody wrote, so every grid lookup hits
  entry 0 (a broadcast, no bank conflicts: Nsight, session 12 call 1): the real compute is slower than
  9.6 us; and "more grid copies are slower" was their fill (a global load waited for each store),
  fixed in matvec_q8_iq3's init (32 copies, filled fast: 14.1 us alone against 14.2 with one).
- x's records in shared memory (X = 1) change the compute little; made by the CTA (X = 2, no qx
  launch) they cost ~2.4 us at 14336 columns but win at 4096x4096 (5.0 against mv_iq2's 6.1).
- Over iq3_groups.repack12 (TIQ3_XXSW: 535 against 781 SASS instructions in the 8-row loop) it runs
  faster under Nsight Compute (11.2 against 12.4 us, compute alone) but not in the captured graph
  (11.3 against 9.6): unexplained.

Only in modules that name an `mvt<` kernel (matvec_q8._module, the sweep, the emulator tests): the
default modules' text is unchanged.
"""

C_TMA = r"""
#define LT_MAX_TRIPS 16   // mvt: trips of 128 chunks a row (cols up to 65536 for 256-value blocks)
// Over any struct with a shared-memory load (T::load<true>: matvec_q8's integer structs, IQ3_XXS_G4's,
// the K types'); a row's bytes a multiple of 16 (IQ3_XXS_G4: an even number of groups; Q4_K: any).
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
__device__ __forceinline__ unsigned lt_clock_lo() {   // the GPU's nanosecond timer, low 32 bits
    unsigned t;
    asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(t));
    return t;
}
#else   // the host emulator: the copy done at once; a barrier keeps the bytes expected less those copied
#define __align__(n)     // (x86 reads the misaligned words the device would not meet)
// Bit 62: initialized, bit 61: bytes expected, the low 40 bits (signed): bytes expected - bytes copied.
// A wait on a barrier that is not initialized, never expected bytes, or is owed bytes (a copy sent to
// the wrong barrier, a wrong count) counts in lt_emu_barrier_errors (the tests read it: the device
// would hang or read stale shared memory). mvt issues every copy before the barrier its waiters pass.
extern "C" { int lt_emu_barrier_errors = 0; }
inline void lt_mbar_init(unsigned long long* b, unsigned) { __atomic_store_n(b, 1ULL << 62, __ATOMIC_SEQ_CST); }
inline void lt_mbar_fence_init() {}
inline void lt_mbar_expect(unsigned long long* b, unsigned bytes) {
    __atomic_fetch_or(b, 1ULL << 61, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(b, (unsigned long long)bytes, __ATOMIC_SEQ_CST);
}
inline void lt_bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* b) {
    std::memcpy(dst, src, bytes);
    __atomic_fetch_sub(b, (unsigned long long)bytes, __ATOMIC_SEQ_CST);
}
inline void lt_mbar_wait(unsigned long long* b, unsigned) {
    const unsigned long long v = __atomic_load_n(b, __ATOMIC_SEQ_CST);
    if (!(v & (1ULL << 62)) || !(v & (1ULL << 61)) || (v & ((1ULL << 40) - 1)) != 0)
        __atomic_fetch_add(&lt_emu_barrier_errors, 1, __ATOMIC_SEQ_CST);
}
inline unsigned lt_clock_lo() { return 0; }
#endif
// D = 3 (scripts/mvt_timeline.py): thread 0 of each team stamps event k (0 entry, 6 the copies issued,
// 1 past the PDL wait, 2 + t trip t's data there (after trip t - 1's compute; trips 0-3), 7 the
// compute done) into out as words (CTA b, team m: 32 b + 8 m + k), the product after them (out must
// hold 32 words a CTA more; the stamps before the PDL wait: out must not be the previous kernel's).
#define LT_STAMP(k) do { if (D == 3 && (threadIdx.x & 127) == 0) \
    ((unsigned*)out)[blockIdx.x * 32 + (threadIdx.x >> 7) * 8 + (k)] = lt_clock_lo(); } while (0)
// mvt<T, N, RR, TR, D, X, Q, RW>: TR teams of 128 threads a CTA, team t on rows t*RR..t*RR+RR-1 of the
// CTA's RR*TR, the rows in dynamic shared memory (the launcher passes RR*TR*rb bytes), so that one CTA can
// hold an SM's whole share of the matrix and fill the struct's tables (T::init: e.g. IQ3_XXS_G4's 16
// grid copies, 16 KB) once an SM; x's records are read once a team. Warp 0's lanes issue the copies
// (lane l: rows l, l+32, ...), trip by trip. D (diagnostics, the sweep only): 1 = no copies and no
// waits (the compute over whatever shared memory holds: what the compute alone takes); 2 = the copies
// and the waits, no compute (what the bulk copies alone take).
#ifdef __CUDA_ARCH__
#define LT_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#else   // the emulator runs one block at a time
#define LT_DYN_SMEM(name) static unsigned char name[1 << 18]
#endif
// X: where x's records come from: 0 read from x (qx's output) as they are needed; 1 copied whole into
// shared memory after the rows (then read from there); 2 quantized by the CTA itself from x's floats
// into shared memory (x is then the float vector; Q, RW: qx's struct and record words), so that no qx
// launch comes before it. The launcher adds N * cols / 32 * RW * 4 bytes for X > 0. X > 0 serves the
// integer structs only (xa, xb are 0: the float structs' dots need them).
template <class T>
__device__ __forceinline__ void load_x_sh(const float* xr, int c, float4 (&xv)[8]) {
    #pragma unroll
    for (int k = 0; k < 8; k++) xv[k] = *(const float4*)(xr + T::xoff(c, k));
}
template <class T, int N, int RR, int TR, int D, int X = 0, class Q = T, int RW = 20>
__global__ void __launch_bounds__(128 * TR) mvt(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                                float* __restrict__ out, int rows, int cols) {
    constexpr int TRIP = 128 / T::CPB * T::TS, CR = RR * TR;   // bytes a row and trip; rows a CTA
    static_assert(D != 3 || TR <= 4, "D = 3 stamps 4 teams at most");
    LT_STAMP(0);
    LT_DYN_SMEM(rs);
    __shared__ __align__(8) unsigned long long bar[LT_MAX_TRIPS * TR];   // trip t, team m: bar[t * TR + m]
    T::init();
    const int row0 = blockIdx.x * CR, nb = cols / T::BE, chunks = nb * T::CPB, rb = nb * T::TS;
    const int trips = (chunks + 127) >> 7;           // (the launcher keeps trips <= LT_MAX_TRIPS)
    if (D != 1 && threadIdx.x < 32) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < trips * TR; i++) lt_mbar_init(bar + i, 1);
            lt_mbar_fence_init();
            for (int i = 0; i < trips * TR; i++) lt_mbar_expect(bar + i, RR * min(TRIP, rb - i / TR * TRIP));
        }
        __syncwarp();
        for (int t = 0; t < trips; t++) {            // weights do not depend on the previous kernel
            const int off = t * TRIP, bytes = min(TRIP, rb - off);
            for (int r = threadIdx.x; r < CR; r += 32)   // rows past the end copy the last row; never written
                lt_bulk_load(rs + r * rb + off, w + (long long)min(row0 + r, rows - 1) * rb + off, bytes, bar + t * TR + r / RR);
        }
    }
    __syncthreads();
    LT_STAMP(6);
    PDL_PROLOGUE();
    LT_STAMP(1);
    float* const xs = (float*)(rs + CR * rb);        // X > 0: x's records, row n at n * chunks * RW
    if constexpr (X == 1) {
        for (int n = 0; n < N; n++)
            for (int i = threadIdx.x; i < chunks * RW / 4; i += 128 * TR)
                ((float4*)(xs + n * chunks * RW))[i] = __ldg((const float4*)(x + (long long)n * cols) + i);
        __syncthreads();
    } else if constexpr (X == 2) {
        for (int n = 0; n < N; n++)                  // (every lane of a warp the same trips: shuffles)
            for (int t = threadIdx.x; t < (chunks * 8 + 128 * TR - 1) / (128 * TR) * (128 * TR); t += 128 * TR)
                qx_one<Q, RW>(x + (long long)n * cols, (unsigned*)(xs + n * chunks * RW), t >> 3, t & 7, (t >> 3) < chunks);
        __syncthreads();
    }
    const int team = threadIdx.x >> 7, tt = threadIdx.x & 127;
    const unsigned char* mine = rs + team * RR * rb;
    float acc[RR][N];
    #pragma unroll
    for (int r = 0; r < RR; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    // A last half trip (rows of 448 chunks: 14336 columns) goes to all 128 threads, half the rows each:
    // else warps 0-1 do 4 trips and 2-3 do 3, and wait at the closing barrier (Nsight: ~16% of issue).
    const bool halves = RR % 2 == 0 && (chunks & 127) == 64;
    const int whole = halves ? chunks - 64 : chunks;
    for (int c = tt, t = 0; c < whole; c += 128, t++) {
        if (D != 1) lt_mbar_wait(bar + t * TR + team, 0);
        if (t < 4) LT_STAMP(2 + t);
        if (D == 2) continue;
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float4 xv[8];
            float xa = 0.f, xb = 0.f;
            if constexpr (X == 0) load_x<T>(x + (long long)n * cols, c, xv, xa, xb);
            else load_x_sh<T>(xs + n * chunks * RW, c, xv);   // (xa, xb: the float structs' only)
            #pragma unroll
            for (int r = 0; r < RR; r++) {
                typename T::Raw raw;
                T::template load<true>(raw, mine + r * rb, c);
                acc[r][n] += T::dot(raw, c, xv, xa, xb);
            }
        }
    }
    if (halves) {
        const int c = whole + (tt & 63), h = tt >> 6;   // (h: the same across a warp)
        if (D != 1) lt_mbar_wait(bar + (whole >> 7) * TR + team, 0);
        if ((whole >> 7) < 4) LT_STAMP(2 + (whole >> 7));
        #pragma unroll
        for (int n = 0; n < (D == 2 ? 0 : N); n++) {
            float4 xv[8];
            float xa = 0.f, xb = 0.f;
            if constexpr (X == 0) load_x<T>(x + (long long)n * cols, c, xv, xa, xb);
            else load_x_sh<T>(xs + n * chunks * RW, c, xv);
            #pragma unroll
            for (int q = 0; q < RR / 2; q++) {
                typename T::Raw raw;
                T::template load<true>(raw, mine + (h * (RR / 2) + q) * rb, c);
                const float v = T::dot(raw, c, xv, xa, xb);
                acc[q][n] += h ? 0.f : v;
                acc[q + RR / 2][n] += h ? v : 0.f;
            }
        }
    }
    LT_STAMP(7);
    __shared__ float red[4 * TR][RR * N];            // a team's 4 warps' sums
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    #pragma unroll
    for (int r = 0; r < RR; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float v = acc[r][n];
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) red[warp][r * N + n] = v;
        }
    __syncthreads();
    if (tt < RR * N) {
        const int r = tt / N, n = tt % N, row = row0 + team * RR + r, w4 = 4 * team;
        if (row < rows) (D == 3 ? out + 32 * gridDim.x : out)[(long long)n * rows + row] = (red[w4][tt] + red[w4 + 1][tt]) + (red[w4 + 2][tt] + red[w4 + 3][tt]);
    }
}
"""


def wanted(names):
    """True when a module's kernel names include an mvt kernel (then its text needs C_TMA)."""
    return any(n.startswith("mvt<") for n in names)
