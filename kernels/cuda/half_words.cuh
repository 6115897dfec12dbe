
__device__ __forceinline__ float lt_h2f_lo(unsigned v) { return lt_h2f((unsigned short)(v & 0xFFFFu)); }
__device__ __forceinline__ float lt_h2f_hi(unsigned v) { return lt_h2f((unsigned short)(v >> 16)); }
