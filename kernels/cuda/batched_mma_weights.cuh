// The weight types of the batched products (kernels/batched_mma.py): each dequantizes a tile of BMMA_ROWS rows x
// BMMA_K columns of its blocks into a shared int8 tile (a row BMMA_STRIDE bytes) with its scales, 128 threads
// together. sc[row * 16 + i]: the scale of run i of 32 weights (HALVES: of run i of 16), mn[row * 8 + i] (MINS):
// what a run's sum of x is multiplied by and taken off. Rows past `rows` come out as zeros.
// A unit is a run of 32 weights of one row: 512 a tile, 4 a thread.

// The signature of a type's tile(): w its bytes, the tile's rows r0.. of a rows x cols weight at columns k0..
#define BMMA_TILE_ARGS const unsigned char* __restrict__ w, int r0, int rows, int cols, int k0, unsigned char* q, \
                       float* sc, float* mn

// Calls run(r, j, dst, s, m) for each unit of the tile (weight row r, run j, dst its 8 words of the int8 tile,
// s and m the row's scales and minimums); a unit past `rows` gets zeros instead.
template <class F>
__device__ __forceinline__ void bmma_each_run(int r0, int rows, unsigned char* q, float* sc, float* mn, F run) {
    for (int u = threadIdx.x; u < BMMA_ROWS * 8; u += 128) {
        const int row = u >> 3, j = u & 7;
        unsigned* dst = (unsigned*)(q + row * BMMA_STRIDE + 32 * j);
        if (r0 + row < rows) {
            run(r0 + row, j, dst, sc + row * 16, mn + row * 8);
            continue;
        }
        for (int k = 0; k < 8; k++) dst[k] = 0u;
        sc[row * 16 + j] = sc[row * 16 + 8 + j] = mn[row * 8 + j] = 0.f;
    }
}

// A Q4_K or Q5_K block's scale and minimum of run j (d and dmin first, then the 12 bytes of 6-bit fields).
__device__ __forceinline__ void bmma_scale_min(const unsigned char* b, int j, float* sc, float* mn) {
    const unsigned dd = __ldg((const unsigned*)b);
    const unsigned char* s = b + 4;
    int s6, m6;
    if (j < 4) { s6 = __ldg(s + j) & 63; m6 = __ldg(s + j + 4) & 63; }
    else {
        s6 = (__ldg(s + j + 4) & 0xF) | ((__ldg(s + j - 4) >> 6) << 4);
        m6 = (__ldg(s + j + 4) >> 4) | ((__ldg(s + j) >> 6) << 4);
    }
    *sc = half_bits_to_float((unsigned short)(dd & 0xFFFFu)) * (float)s6;
    *mn = half_bits_to_float((unsigned short)(dd >> 16)) * (float)m6;
}

// Q4_K (144-byte blocks: d, dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles): run j of 32
// is the low (j even) or high nibbles of bytes 32 (j / 2)..+31, q in 0..15, w = d sc q - dmin m.
struct BmmaQ4K {
    static constexpr bool HALVES = false, MINS = true;
    __device__ static __forceinline__ void tile(BMMA_TILE_ARGS) {
        bmma_each_run(r0, rows, q, sc, mn, [&](int r, int j, unsigned* dst, float* s, float* m) {
            const unsigned char* b = w + ((long long)r * (cols / 256) + k0 / 256) * 144;
            const unsigned* qs = (const unsigned*)(b + 16 + 32 * (j >> 1));
            for (int k = 0; k < 8; k++) dst[k] = (__ldg(qs + k) >> (4 * (j & 1))) & 0x0F0F0F0Fu;
            bmma_scale_min(b, j, s + j, m + j);
        });
    }
};

// Q5_K (176-byte blocks: d, dmin, the 6-bit scales and minimums as Q4_K's, 32 bytes of high bits, 128 of
// nibbles): run j as Q4_K's, its weight l's fifth bit bit j of high byte l; q in 0..31, w = d sc q - dmin m.
struct BmmaQ5K {
    static constexpr bool HALVES = false, MINS = true;
    __device__ static __forceinline__ void tile(BMMA_TILE_ARGS) {
        bmma_each_run(r0, rows, q, sc, mn, [&](int r, int j, unsigned* dst, float* s, float* m) {
            const unsigned char* b = w + ((long long)r * (cols / 256) + k0 / 256) * 176;
            const unsigned *qs = (const unsigned*)(b + 48 + 32 * (j >> 1)), *qh = (const unsigned*)(b + 16);
            for (int k = 0; k < 8; k++)
                dst[k] = ((__ldg(qs + k) >> (4 * (j & 1))) & 0x0F0F0F0Fu) | (((__ldg(qh + k) >> j) & 0x01010101u) << 4);
            bmma_scale_min(b, j, s + j, m + j);
        });
    }
};

// Q6_K (210-byte blocks: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d): run j of 32 is
// half h = j / 4, quarter t = j % 4 of it (values 128 h + 32 t + l), q - 32 in -32..31 as int8, a scale a 16.
struct BmmaQ6K {
    static constexpr bool HALVES = true, MINS = false;
    __device__ static __forceinline__ void tile(BMMA_TILE_ARGS) {
        bmma_each_run(r0, rows, q, sc, mn, [&](int r, int j, unsigned* dst, float* s, float*) {
            const int h = j >> 2, t = j & 3;
            const unsigned char* b = w + ((long long)r * (cols / 256) + k0 / 256) * 210;
            const unsigned char* ql = b + 64 * h + 32 * (t & 1);
            const unsigned char* qh = b + 128 + 32 * h;
            for (int k = 0; k < 8; k++) {
                unsigned word = 0;
                for (int i = 0; i < 4; i++) {
                    const int l = 4 * k + i;
                    const unsigned lo4 = (t >> 1) ? (__ldg(ql + l) >> 4) : (__ldg(ql + l) & 15u);
                    const unsigned v = lo4 | (((__ldg(qh + l) >> (2 * t)) & 3u) << 4);
                    word |= ((v - 32u) & 0xFFu) << (8 * i);
                }
                dst[k] = word;
            }
            const float d = half_bits_to_float(__ldg((const unsigned short*)(b + 208)));
            s[2 * j] = d * (float)(signed char)__ldg(b + 192 + 8 * h + 2 * t);
            s[2 * j + 1] = d * (float)(signed char)__ldg(b + 193 + 8 * h + 2 * t);
        });
    }
};

// Q8_0 (34-byte blocks: d, 32 int8): run j is block k0 / 32 + j of the row.
struct BmmaQ80 {
    static constexpr bool HALVES = false, MINS = false;
    __device__ static __forceinline__ void tile(BMMA_TILE_ARGS) {
        bmma_each_run(r0, rows, q, sc, mn, [&](int r, int j, unsigned* dst, float* s, float*) {
            const unsigned char* b = w + ((long long)r * (cols / 32) + k0 / 32 + j) * 34;
            const unsigned short* qs = (const unsigned short*)(b + 2);
            for (int k = 0; k < 8; k++) dst[k] = (unsigned)__ldg(qs + 2 * k) | ((unsigned)__ldg(qs + 2 * k + 1) << 16);
            s[j] = half_bits_to_float(__ldg((const unsigned short*)b));
        });
    }
};
