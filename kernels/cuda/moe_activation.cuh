// The activation of gate and up, shared by moe_act_f32/f16 and the gated decode product.
#ifndef LT_MOE_ACT
#define LT_MOE_ACT
// The CPU backend's formulas (lite/backends/cpu.py act_mul).
__device__ __forceinline__ float moe_act(float g, float u, int gelu) {
    if (!gelu) return g / (1.f + expf(-g)) * u;
    const float c = 0.7978845608028654f;
    return 0.5f * g * (1.f + tanhf(c * (g + 0.044715f * g * g * g))) * u;
}
#endif
