// The IQ weight types of the batched products (kernels/batched_mma.py), as batched_mma_weights.cuh's: each
// dequantizes a tile of BMMA_ROWS rows x BMMA_K columns into the shared int8 tile with a scale a run of 32.
// IQ3_XXS in each layout the GPU backend may hold it in at product time (kernels/gpu_layout.py): the file's
// blocks, IQ3_XXS_G4 and IQ3_XXS_B16; its grid bytes (4..62) and their signs fit int8 as they are.
#include "iq3_grid.cuh"
#include "iq4_values.cuh"
#include "iq3_b16_fields.cuh"

// Grid word g (4 unsigned bytes) with byte i negated where bit i of s4 is set: s4 * 0x00204081 puts bit i at
// bit 8 i, and (g ^ 0xFF) + 1 is -g in a byte without a carry out of it (grid bytes are never 0).
__device__ __forceinline__ unsigned bmma_signed_word(unsigned g, unsigned s4) {
    const unsigned m = ((s4 * 0x00204081u) & 0x01010101u) * 0xFFu;
    return (g ^ m) + (m & 0x01010101u);
}

// IQ3_XXS, the file's blocks (98 bytes: d, 64 grid indices, a word a run: four 7-bit sign fields completed to
// even parity, the 4-bit scale on top): w = d (0.5 + s) / 2 grid sign.
struct BmmaIq3Xxs {
    static constexpr bool HALVES = false, MINS = false;
    __device__ static __forceinline__ void tile(BMMA_TILE_ARGS) {
        bmma_each_run(r0, rows, q, sc, mn, [&](int r, int j, unsigned* dst, float* s, float*) {
            const unsigned short* h = (const unsigned short*)(w + ((long long)r * (cols / 256) + k0 / 256) * 98);
            const unsigned aux = __ldg(h + 33 + 2 * j) | ((unsigned)__ldg(h + 34 + 2 * j) << 16);
            for (int l = 0; l < 4; l++) {
                const unsigned s7 = (aux >> (7 * l)) & 127u, s8 = s7 | ((__popc(s7) & 1u) << 7);
                const unsigned qq = __ldg(h + 1 + 4 * j + l);       // the grid indices of words 2 l, 2 l + 1
                dst[2 * l] = bmma_signed_word(__ldg(IQ3XXS_GRID + (qq & 255u)), s8 & 15u);
                dst[2 * l + 1] = bmma_signed_word(__ldg(IQ3XXS_GRID + (qq >> 8)), s8 >> 4);
            }
            s[j] = half_bits_to_float(__ldg(h)) * (0.5f + (float)(aux >> 28)) * 0.5f;
        });
    }
};

// IQ3_XXS_G4 (kernels/iq3_groups.py: a row's blocks by fours, 408 bytes: 256 grid indices, 32 sign words with
// word w's 4 signs at bits w, 8 + w, 16 + w, 24 + w, a scale word a block, 4 d): block k0 / 256 is block k of
// its group, run j chunk 8 k + j.
struct BmmaIq3XxsGroups4 {
    static constexpr bool HALVES = false, MINS = false;
    __device__ static __forceinline__ void tile(BMMA_TILE_ARGS) {
        const int k = (k0 >> 8) & 3;
        bmma_each_run(r0, rows, q, sc, mn, [&](int r, int j, unsigned* dst, float* s, float*) {
            const unsigned char* b = w + (long long)r * (cols / 1024 * 408) + k0 / 1024 * 408;
            const int c = 8 * k + j;
            const uint2 idx = __ldg((const uint2*)(b + 8 * c));
            const unsigned sw = __ldg((const unsigned*)(b + 256 + 4 * c));
            for (int v = 0; v < 8; v++) {
                const unsigned i = ((v < 4 ? idx.x : idx.y) >> (8 * (v & 3))) & 255u;
                const unsigned m = ((sw >> v) & 0x01010101u) * 0xFFu;
                const unsigned g = __ldg(IQ3XXS_GRID + i);
                dst[v] = (g ^ m) + (m & 0x01010101u);
            }
            const unsigned s4 = (__ldg((const unsigned*)(b + 384 + 4 * k)) >> (4 * j)) & 15u;
            s[j] = half_bits_to_float(__ldg((const unsigned short*)(b + 400 + 2 * k))) * (0.5f + (float)s4) * 0.5f;
        });
    }
};

// IQ3_XXS_B16 (kernels/iq3_b16.py: a record of 1632 bytes a band of 16 rows and block of 256 columns): a warp a
// band (the tile's 4), its lanes decoding their fields (iq3_b16_fields.cuh) as dequantize_bands16 does.
struct BmmaIq3XxsBands16 {
    static constexpr bool HALVES = false, MINS = false;
    __device__ static __forceinline__ void tile(BMMA_TILE_ARGS) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
        const int band = r0 / 16 + warp, base = 16 * warp;
        if (16 * band >= rows) {               // (rows are whole bands)
            for (int i = lane; i < 16 * 64; i += 32) ((unsigned*)(q + (base + i / 64) * BMMA_STRIDE))[i & 63] = 0u;
            for (int i = lane; i < 16 * 8; i += 32) sc[(base + i / 8) * 16 + (i & 7)] = 0.f;
            return;
        }
        const unsigned char* rec = w + ((long long)band * (cols / 256) + k0 / 256) * 1632;
        unsigned wd[12];
        band_words(rec, lane, wd);
        for (int cp = 0; cp < 4; cp++)
            for (int odd = 0; odd < 2; odd++)
                for (int k = 0; k < 4; k++) {
                    const int c = 2 * cp + odd, row = base + g + 8 * (k & 1), word = qd + 4 * (k >> 1);
                    unsigned idx, signs;
                    band_field(wd, cp, odd, k, idx, signs);
                    *(unsigned*)(q + row * BMMA_STRIDE + 32 * c + 4 * word) =
                        bmma_signed_word(__ldg(IQ3XXS_GRID + idx), signs);
                }
        if (qd == 0) {                         // rows g and g + 8: their scale words and d
            const uint2 s = __ldg((const uint2*)(rec + 1536) + g);
            const unsigned dd = __ldg((const unsigned*)(rec + 1600) + g);
            const float d0 = half_bits_to_float((unsigned short)(dd & 0xFFFFu));
            const float d1 = half_bits_to_float((unsigned short)(dd >> 16));
            for (int c = 0; c < 8; c++) {
                sc[(base + g) * 16 + c] = d0 * (0.5f + (float)((s.x >> (4 * c)) & 15u)) * 0.5f;
                sc[(base + g + 8) * 16 + c] = d1 * (0.5f + (float)((s.y >> (4 * c)) & 15u)) * 0.5f;
            }
        }
    }
};

// IQ4_XS (136 bytes: d, the scales' high 2 bits a run, their low 4 bits, 16 bytes a run: low nibbles its
// weights 0..15, high nibbles 16..31), w = d (s - 32) IQ4_KVALUES[nibble]; the 16 values as int8 looked up 4 at
// once by byte permutes (llama.cpp's get_int_from_table_16).
__device__ __forceinline__ unsigned bmma_iq4_values(unsigned v, const unsigned (&t)[4]) {
    const unsigned sel = (v & 7u) | ((v >> 4) & 0x70u) | ((v >> 8) & 0x700u) | ((v >> 12) & 0x7000u);
    const unsigned m = ((v >> 3) & 0x01010101u) * 0xFFu;   // bytes whose index is 8..15
    return (__byte_perm(t[0], t[1], sel) & ~m) | (__byte_perm(t[2], t[3], sel) & m);
}

struct BmmaIq4Xs {
    static constexpr bool HALVES = false, MINS = false;
    __device__ static __forceinline__ void tile(BMMA_TILE_ARGS) {
        unsigned t[4] = {0u, 0u, 0u, 0u};
        for (int i = 0; i < 16; i++) t[i >> 2] |= ((unsigned)IQ4_KVALUES[i] & 0xFFu) << (8 * (i & 3));
        bmma_each_run(r0, rows, q, sc, mn, [&](int r, int j, unsigned* dst, float* s, float*) {
            const unsigned* b = (const unsigned*)(w + ((long long)r * (cols / 256) + k0 / 256) * 136);
            for (int k = 0; k < 4; k++) {
                const unsigned v = __ldg(b + 2 + 4 * j + k);
                dst[k] = bmma_iq4_values(v & 0x0F0F0F0Fu, t);
                dst[4 + k] = bmma_iq4_values((v >> 4) & 0x0F0F0F0Fu, t);
            }
            const unsigned w0 = __ldg(b), w1 = __ldg(b + 1);
            const int ls = (int)(((w1 >> (4 * j)) & 15u) | (((w0 >> (16 + 2 * j)) & 3u) << 4));
            s[j] = half_bits_to_float((unsigned short)(w0 & 0xFFFFu)) * (float)(ls - 32);
        });
    }
};
