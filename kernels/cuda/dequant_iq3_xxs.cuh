
// 8 values of group g (0..31) of block blk of w16: same float ops as gguf-py. G4 = 0: a block is 49
// 16-bit words (d, 32 words of grid indices, 16 of signs and scales); G4 = 1 (IQ3_XXS_G4): four
// blocks are 204 words, their 4 x 32 index words, 32 sign words (32-bit: chunk c's signs, weight
// 4w + i at bit 8i + w), 4 scale words (32-bit: chunk 8k + c's scale at bits 4c), then their 4 d.
template <int G4>
__device__ __forceinline__ void iq3xxs_group(const unsigned short* __restrict__ w16, long long blk, int g,
                                             const unsigned* gs, float v[8]) {
    const int ib = g >> 2, k = G4 ? (int)(blk & 3) : 0;   // k: the block's place in its four
    const unsigned short* b = G4 ? w16 + (blk >> 2) * 204 : w16 + blk * 49;
    const unsigned q = __ldg((G4 ? b + 32 * k : b + 1) + g);
    unsigned sb, scale;                                    // sb: the 8 values' signs (bit j: value j)
    if (G4) {
        const unsigned* b32 = (const unsigned*)b;          // (IQ3_XXS_G4 blocks are 4-aligned: launch())
        const unsigned s32 = __ldg(b32 + 64 + 8 * k + ib), l = g & 3;
        // value j < 4 is bit 8j + 2l, value j + 4 bit 8j + 2l + 1: a byte's bit 0 each, gathered
        // into 4 bits by one multiply (bit 8i lands at 24 + i; no two products meet)
        sb = ((((s32 >> (2 * l)) & 0x01010101u) * 0x01020408u) >> 24)
           | (((((s32 >> (2 * l + 1)) & 0x01010101u) * 0x01020408u) >> 24) << 4);
        scale = (__ldg(b32 + 96 + k) >> (4 * ib)) & 15u;
    } else {
        const unsigned aux = __ldg(b + 33 + 2 * ib) | ((unsigned)__ldg(b + 34 + 2 * ib) << 16);
        sb = ksign((aux >> (7 * (g & 3))) & 127u);
        scale = aux >> 28;
    }
    const float db = __fmul_rn(__fmul_rn(h2f(__ldg(G4 ? b + 200 + k : b)), __fadd_rn(0.5f, (float)scale)), 0.5f);
    const unsigned g0 = gs[q & 255u], g1 = gs[q >> 8];
    #pragma unroll
    for (int j = 0; j < 4; j++) {
        const float a = __fmul_rn(db, (float)((g0 >> (8 * j)) & 255u));
        const float c = __fmul_rn(db, (float)((g1 >> (8 * j)) & 255u));
        v[j] = ((sb >> j) & 1u) ? -a : a;
        v[j + 4] = ((sb >> (j + 4)) & 1u) ? -c : c;
    }
}

// Group t (8 values) of the blocks at w16 as 8 fp16 in one 16-byte store.
template <int G4>
__device__ __forceinline__ uint4 iq3xxs_group_f16(const unsigned short* __restrict__ w16, long long t,
                                                  const unsigned* gs) {
    float v[8];
    iq3xxs_group<G4>(w16, t >> 5, (int)(t & 31), gs, v);
    uint4 w;
    w.x = f2h(v[0]) | ((unsigned)f2h(v[1]) << 16); w.y = f2h(v[2]) | ((unsigned)f2h(v[3]) << 16);
    w.z = f2h(v[4]) | ((unsigned)f2h(v[5]) << 16); w.w = f2h(v[6]) | ((unsigned)f2h(v[7]) << 16);
    return w;
}

template <int G4>
__device__ __forceinline__ void iq3xxs_deq_f16_body(const unsigned short* __restrict__ w16, uint4* __restrict__ out,
                                                    long long n_groups) {
    __shared__ unsigned gs[256];
    gs[threadIdx.x] = IQ3XXS_GRID[threadIdx.x];
    __syncthreads();
    for (long long t = blockIdx.x * 256LL + threadIdx.x; t < n_groups; t += (long long)gridDim.x * 256)
        out[t] = iq3xxs_group_f16<G4>(w16, t, gs);
}

template <int G4>
__device__ __forceinline__ void iq3xxs_deq_f32_body(const unsigned short* __restrict__ w16, float4* __restrict__ out,
                                                    long long n_groups) {
    __shared__ unsigned gs[256];
    gs[threadIdx.x] = IQ3XXS_GRID[threadIdx.x];
    __syncthreads();
    for (long long t = blockIdx.x * 256LL + threadIdx.x; t < n_groups; t += (long long)gridDim.x * 256) {
        float v[8];
        iq3xxs_group<G4>(w16, t >> 5, (int)(t & 31), gs, v);
        out[2 * t] = make_float4(v[0], v[1], v[2], v[3]);
        out[2 * t + 1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

extern "C" __global__ void __launch_bounds__(256) iq3xxs_deq_f16(
        const unsigned short* __restrict__ w16, uint4* __restrict__ out, long long n_groups) {
    iq3xxs_deq_f16_body<0>(w16, out, n_groups);
}
extern "C" __global__ void __launch_bounds__(256) iq3xxs_deq_f32(
        const unsigned short* __restrict__ w16, float4* __restrict__ out, long long n_groups) {
    iq3xxs_deq_f32_body<0>(w16, out, n_groups);
}
extern "C" __global__ void __launch_bounds__(256) iq3xxs_g4_deq_f16(
        const unsigned short* __restrict__ w16, uint4* __restrict__ out, long long n_groups) {
    iq3xxs_deq_f16_body<1>(w16, out, n_groups);
}
extern "C" __global__ void __launch_bounds__(256) iq3xxs_g4_deq_f32(
        const unsigned short* __restrict__ w16, float4* __restrict__ out, long long n_groups) {
    iq3xxs_deq_f32_body<1>(w16, out, n_groups);
}

// The MoE prefill's gathered dequantize (kernels/moe_layer.gather_dequant, same arguments as the
// tiled types' deq_*_f16 there): block row y dequantizes expert sel[y] (-1: none), found at slot
// slot_of[sel[y]] of src0 (slot_of null: slot = expert), into out0 row y of n fp16; each thread
// one group of 8 (GATHER_TILE = 2048 values a block).
extern "C" __global__ void __launch_bounds__(256) iq3xxs_gather_f16(
        const unsigned char* __restrict__ src0, long long nbytes, uint4* __restrict__ out0, long long n,
        const int* __restrict__ sel, const int* __restrict__ slot_of) {
    __shared__ unsigned gs[256];
    gs[threadIdx.x] = IQ3XXS_GRID[threadIdx.x];
    __syncthreads();
    const int e = sel[blockIdx.y];
    const int s = e < 0 ? -1 : (slot_of ? slot_of[e] : e);
    const long long t = blockIdx.x * 256LL + threadIdx.x;
    if (s < 0 || t >= (n >> 3)) return;
    const unsigned short* w16 = (const unsigned short*)(src0 + (long long)s * nbytes);
    out0[(long long)blockIdx.y * (n >> 3) + t] = iq3xxs_group_f16<0>(w16, t, gs);
}
