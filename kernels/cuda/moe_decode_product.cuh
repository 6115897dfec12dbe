// The decode product over experts, a lane group a row (kernels/moe_products.py says how): one block
// a token-slot pair, L lanes a row, C chunks a lane a pass, R rows a group. It needs the type structs,
// load_x and moe_act before it (moe_products.decode_source puts them there).
// At most 128 registers (4 CTAs an SM): unbounded, nvcc hoists all C chunks' x loads and an
// instance may take twice that (2 CTAs an SM); bounded, no instance spills.
// A (gated) 1 silu, 2 gelu_tanh: a group's R rows are R/2 units of gate (w0) and the same units of
// up (w1), and its lanes write moe_act(gate, up) into out0 (one launch, no z, no activation launch).
template <class T, int L, int C, int R, int A = 0>
__global__ void __launch_bounds__(128, 4) moe_decode_product(
        const unsigned char* __restrict__ w0, const unsigned char* __restrict__ w1, long long ebytes,
        const int* __restrict__ slot_of, const float* __restrict__ x, float* __restrict__ out0,
        float* __restrict__ out1, const int* __restrict__ blk_expert, const int* __restrict__ blk_rows,
        int kdiv, int S, int rows, int cols, int x_by_row) {
    static_assert(L == 8 || L == 16 || L == 32, "a lane group is 8, 16 or 32 lanes of one warp");
    PDL_PROLOGUE();                            // the experts come from routing (pdl.cuh)
    const int b = blockIdx.y;                  // one token-slot a block (N = 1)
    const int e = blk_expert[b];
    if (e < 0) return;
    const int slot = slot_of ? slot_of[e] : e;
    if (slot < 0) return;                      // not resident this round
    const int tok = blk_rows ? blk_rows[b] : (b < S ? b / kdiv : -1);
    if (tok < 0) return;                       // padding; all three returns are uniform over the block
    T::init();                                 // per-type tables in shared memory (IQ types)
    constexpr int H = A ? R / 2 : R;           // output rows (units) a group
    static_assert(!A || R % 2 == 0, "a gated group takes gate and up rows in pairs");
    const unsigned char* w = (blockIdx.z ? w1 : w0) + (long long)slot * ebytes;
    float* out = blockIdx.z ? out1 : out0;
    const float* xp = x + (long long)(x_by_row ? b : tok) * cols;   // down: x is one row a slot
    const int g = threadIdx.x / L, lg = threadIdx.x % L;
    const int row0 = (blockIdx.x * (128 / L) + g) * H;
    const int nb = cols / T::BE, chunks = nb * T::CPB;
    const long long rb = (long long)nb * T::TS;
    const unsigned char* rowp[R];
    #pragma unroll
    for (int r = 0; r < R; r++)               // tail rows: not written
        rowp[r] = (A && r >= H ? w1 + (long long)slot * ebytes : w) + (long long)min(row0 + r % H, rows - 1) * rb;
    float acc[R];
    #pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    for (int c0 = lg; c0 < chunks; c0 += L * C) {
        // All weight loads of the pass first: R * C independent loads in flight a lane.
        typename T::Raw cur[C][R];
        #pragma unroll
        for (int j = 0; j < C; j++)
            if (c0 + j * L < chunks) {
                #pragma unroll
                for (int r = 0; r < R; r++) T::load(cur[j][r], rowp[r], c0 + j * L);
            }
        #pragma unroll
        for (int j = 0; j < C; j++) {
            const int c = c0 + j * L;
            if (c >= chunks) continue;
            float4 xv[8];                      // x of the chunk (L1/L2: the same for every group)
            float xa, xb;
            load_x<T>(xp, c, xv, xa, xb);
            #pragma unroll
            for (int r = 0; r < R; r++) acc[r] += T::dot(cur[j][r], c, xv, xa, xb);
        }
    }
    // One reduction at the end, inside the group (xor offsets < L stay in it); every lane of the
    // warp takes part (no lane has returned).
    float mine = 0.f, up = 0.f;
    #pragma unroll
    for (int r = 0; r < R; r++) {
        float v = acc[r];
        #pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lg == r % H) {                     // lane r writes row r: a register select, no local array
            if (A && r >= H) up = v; else mine = v;
        }
    }
    if (A) mine = moe_act(mine, up, A == 2);
    if (lg < H && row0 + lg < rows) out[(long long)b * rows + row0 + lg] = mine;
}
