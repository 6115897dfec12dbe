
// The loop every register-kernel launch runs: acc[r][n] = row r . x n over this thread's chunks.
template <class T, int N, int R, int P>
__device__ __forceinline__ void matvec_rows_partials_loop(const unsigned char* const (&rowp)[R], const float* __restrict__ x,
                                        int cols, int chunks, float (&acc)[R][N]) {
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    // P = 1: the next trip's weights are loaded before this trip's are used (software pipelining:
    // loads stay in flight while the thread computes, at the cost of R more Raw in registers).
    typename T::Raw cur[R];
    if (P == 1) {
        #pragma unroll
        for (int r = 0; r < R; r++) T::load(cur[r], rowp[r], min((int)threadIdx.x, chunks - 1));
    }
    for (int c = threadIdx.x; c < chunks; c += 128) {
        typename T::Raw nxt[R];
        #pragma unroll
        for (int r = 0; r < R; r++) {
            if (P == 1) T::load(nxt[r], rowp[r], min(c + 128, chunks - 1));
            else T::load(cur[r], rowp[r], c);
        }
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float4 xv[8];
            float xa, xb;
            load_x<T>(x + (long long)n * cols, c, xv, xa, xb);
            #pragma unroll
            for (int r = 0; r < R; r++) acc[r][n] += T::dot(cur[r], c, xv, xa, xb);
        }
        if (P == 1) {
            #pragma unroll
            for (int r = 0; r < R; r++) cur[r] = nxt[r];
        }
    }
}
// P = 2: matvec_rows_partials_loop<P = 0>, but where a row's chunks end in half a trip (448: 14336
// columns) that half goes to all 128 threads with half the rows each, so that the warps reach the
// closing barrier together (else warps 0-1 do one trip more than 2-3; Nsight put ~12%
// of IQ3_XXS's stall samples on that barrier). The P = 0 loop is called as it is: folding the half
// into its loop changed its code and made it slower, also at 4096 columns, where there is no half trip.
template <class T, int N, int R, int P>
__device__ __forceinline__ void matvec_rows_partials(const unsigned char* const (&rowp)[R], const float* __restrict__ x,
                                            int cols, int chunks, float (&acc)[R][N]) {
    if constexpr (P != 2) {
        matvec_rows_partials_loop<T, N, R, P>(rowp, x, cols, chunks, acc);
    } else {
        const bool halves = R % 2 == 0 && (chunks & 127) == 64;
        matvec_rows_partials_loop<T, N, R, 0>(rowp, x, cols, halves ? chunks - 64 : chunks, acc);
        if constexpr (R % 2 == 0) if (halves) {   // (R odd: no halves, and raw[R / 2] would be empty)
            const int c = chunks - 64 + (threadIdx.x & 63), h = threadIdx.x >> 6;   // (h: the same across a warp)
            typename T::Raw raw[R / 2];
            #pragma unroll
            for (int q = 0; q < R / 2; q++) T::load(raw[q], h ? rowp[q + R / 2] : rowp[q], c);
            #pragma unroll
            for (int n = 0; n < N; n++) {
                float4 xv[8];
                float xa, xb;
                load_x<T>(x + (long long)n * cols, c, xv, xa, xb);
                #pragma unroll
                for (int q = 0; q < R / 2; q++) {
                    const float v = T::dot(raw[q], c, xv, xa, xb);
                    acc[q][n] += h ? 0.f : v;
                    acc[q + R / 2][n] += h ? v : 0.f;
                }
            }
        }
    }
}
// matvec_rows's whole body, also the body of kernels that set something up first (matvec_with_init.cuh: matvec_with_init).
template <class T, int N, int R, int P>
__device__ __forceinline__ void matvec_rows_body(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                        float* __restrict__ out, int rows, int cols) {
    const int row0 = blockIdx.x * R, nb = cols / T::BE, chunks = nb * T::CPB;
    const long long rb = (long long)nb * T::TS;
    const unsigned char* rowp[R];
    #pragma unroll
    for (int r = 0; r < R; r++)   // rows past the end re-read the last row and are not written
        rowp[r] = w + (long long)min(row0 + r, rows - 1) * rb;
    PDL_PROLOGUE();               // (kernels/pdl.py)
    float acc[R][N];
    matvec_rows_partials<T, N, R, P>(rowp, x, cols, chunks, acc);
    __shared__ float red[4][R * N];
    const float total = block_sum<R, N>(acc, red);       // thread r*N+n writes row r, x n
    if (threadIdx.x < R * N) {
        const int r = threadIdx.x / N, n = threadIdx.x % N;
        if (row0 + r < rows) out[(long long)n * rows + row0 + r] = total;
    }
}
template <class T, int N, int R, int P>
__global__ void __launch_bounds__(128) matvec_rows(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                          float* __restrict__ out, int rows, int cols) {
    matvec_rows_body<T, N, R, P>(w, x, out, rows, cols);
}
