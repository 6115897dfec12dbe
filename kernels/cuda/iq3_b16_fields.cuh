// One field of an IQ3_XXS_B16 record (kernels/iq3_b16.py), as lane 4g + q holds it in its 12 words wd: field
// n = 4 cp + k is the lane's word of chunk 2 cp + odd (row g + 8 (k & 1), grid word q + 4 (k >> 1)); out: its
// grid index and its 4 signs (bit i: weight i negative). Read by dequantize_bands16 and the batched product.
__device__ __forceinline__ void band_field(const unsigned (&wd)[12], int cp, int odd, int k, unsigned& idx,
                                           unsigned& signs) {
    const int n = 4 * cp + k;
    if (odd) {
        idx = (wd[6 + cp] >> (8 * k)) & 255u;
        const unsigned s = wd[10 + (n >> 3)] >> (n & 7);
        signs = (s & 1u) | ((s >> 7) & 2u) | ((s >> 14) & 4u) | ((s >> 21) & 8u);
    } else {
        const int bit = 12 * n, wi = bit >> 5, sh = bit & 31;
        const unsigned f = (sh > 20 ? __funnelshift_r(wd[wi], wd[wi + 1], sh) : wd[wi] >> sh) & 0xFFFu;
        idx = f & 255u;
        signs = f >> 8;
    }
}

// A lane's 12 words of the record at rec (three 16-byte loads, one a plane).
__device__ __forceinline__ void band_words(const unsigned char* rec, int lane, unsigned (&wd)[12]) {
    #pragma unroll
    for (int p = 0; p < 3; p++) {
        const uint4 v = __ldg((const uint4*)(rec + 512 * p) + lane);
        wd[4 * p] = v.x; wd[4 * p + 1] = v.y; wd[4 * p + 2] = v.z; wd[4 * p + 3] = v.w;
    }
}
