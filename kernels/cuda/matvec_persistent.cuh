
// The register kernel's loop (matvec_cuda.py `matvec_rows`) made persistent: a CTA walks row groups
// blockIdx.x, +gridDim.x, ... and loads the next item (row group, trip) into registers before
// computing this one, across row-group boundaries too, so loads stay in flight between groups.
template <class T, int N, int R>
__global__ void __launch_bounds__(128) matvec_persistent(const unsigned char* __restrict__ w, const float* __restrict__ x,
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
