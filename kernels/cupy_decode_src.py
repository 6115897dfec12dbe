"""CUDA C of the decode-step attention (one query token), launched through kernels/cupy_decode.py.

Both kernels read the position from the device (a captured graph replays any position) and have
grids fixed by the cache size. Kept apart from the Python wrappers so the file stays readable and
so tests/cuda_c_emulator.py can compile the same text on the host.
"""

from lite.kernels.pdl import C_PDL

# The split merge's hand-off, the same in both attention kernels: this one's (DECODE_SRC) and v2's
# (kernels/cupy_decode2_src.py), which are compiled as separate modules and both prepend it.
C_LAST_OF_COLUMN = r"""
// Is this block the last of the `active` blocks counting on *counter to finish? Called by every
// thread once the block's partials are written (threadFenceReduction pattern: the fence makes them
// visible before the block counts); the last block resets the counter for the next launch, and its
// fence after the count orders its reads of the others' partials. (Also kernels/matvec_epilogue.py.)
__device__ __forceinline__ bool last_block_to_count(int* counter, int active) {
    __shared__ int is_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int ticket = atomicAdd(counter, 1);
        is_last = ticket == active - 1;
        if (is_last) *counter = 0;                 // every block has counted: ready for the next launch
    }
    __syncthreads();
    if (!is_last) return false;
    __threadfence();
    return true;
}
// The split blocks of one column (decode attention) count on counters[blockIdx.x].
__device__ __forceinline__ bool dec_last_of_column(int* counters, int active) {
    return last_block_to_count(counters + blockIdx.x, active);
}
"""

DECODE_SRC = C_LAST_OF_COLUMN + C_PDL + r"""
#ifndef NEG_INF
#define NEG_INF (-__int_as_float(0x7f800000))
#endif
#define DEC_THREADS 128      // four warps
#define DEC_GB 4             // query heads a block serves: one warp each in the softmax
#define DEC_TILE 256         // keys whose scores sit in shared memory at once
#define DEC_MAX_SPLITS 64    // splits of the keys, each a block (per KV head and head group)
#define DEC_MAX_D 256        // key head dim
#define DEC_MAX_ROW 1024     // the longest row rope_kv_store handles
#define DEC_UNROLL 8         // K or V rows a lane has in flight
// attn_decode is held to 168 registers (no spills, sm_90) so three blocks fit an SM; the wrapper
// sizes the grid on that (kernels/cupy_decode.py, _resident_blocks)

__device__ __forceinline__ float dec_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ float dec_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
// eight consecutive cache values: one 16-byte (f16) or 8-byte (int8) load kept raw while in
// flight (half the registers of floats, so twice the loads in flight), then widened to floats
template <typename T> struct Raw8;
template <> struct Raw8<__half> { uint4 u; };
template <> struct Raw8<signed char> { uint2 u; };
__device__ __forceinline__ void dec_raw(const __half* p, Raw8<__half>& r) {
    r.u = *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void dec_raw(const signed char* p, Raw8<signed char>& r) {
    r.u = *reinterpret_cast<const uint2*>(p);
}
__device__ __forceinline__ void dec_cvt(const Raw8<__half>& r, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&r.u);
    for (int i = 0; i < 4; ++i) { float2 v = __half22float2(h[i]); f[2 * i] = v.x; f[2 * i + 1] = v.y; }
}
__device__ __forceinline__ void dec_cvt(const Raw8<signed char>& r, float* f) {
    const signed char* c = reinterpret_cast<const signed char*>(&r.u);
    for (int i = 0; i < 8; ++i) f[i] = (float)c[i];
}
__device__ __forceinline__ void dec_store(__half* p, float v) { *p = __float2half(v); }
__device__ __forceinline__ void dec_store(signed char* p, float v) { *p = (signed char)v; }

// --- RoPE of q and k, and k, v into the cache at *pos, in one launch (a block a row) -----------
// Blocks 0..H-1 rotate the q heads into q_out; blocks H..H+Hkv-1 rotate the k heads into the K
// cache; the next Hkv blocks copy the v heads into the V cache. n_rot = 0: no rotation. int8
// caches (scales != null) get one scale per (head, position) = amax / 127, as KVCache._quantize.
// qn, kn (either may be null): per-head RMSNorm weights (D values) of q and of k (qwen3's
// attn_q_norm/attn_k_norm), applied before the rotation as cupy_ops' rms_norm kernel would.
// DEC_ROPE_THREADS threads a row: one rotated pair each at head dim 128 (the double-precision
// angle is the longest chain of the launch).
#define DEC_ROPE_THREADS 64
// 1/rms of x[0..n) (n <= DEC_MAX_ROW), with the sums in the order of cupy_ops' rms_norm kernel:
// there a thread an element (pow2 >= 32 threads), 32-element warp sums by xor shuffles, then the
// warp sums (zeros for the missing warps) by xor shuffles. Here the warps take the 32-element
// chunks in turn and the chunk sums meet in `chunk`, so the sum tree, and its rounding, is the
// same. All threads of the block call it (it holds a __syncthreads) and get the result.
__device__ __forceinline__ float dec_rms_inv(const float* x, int n, float eps, float* chunk) {
    const int lane = threadIdx.x & 31, nc = (n + 31) >> 5;
    for (int c = threadIdx.x >> 5; c < nc; c += blockDim.x >> 5) {   // uniform over the warp
        int i = c * 32 + lane;
        float s = 0.f;
        if (i < n) { float v = x[i]; s += v * v; }
        s = dec_warp_sum(s);
        if (lane == 0) chunk[c] = s;
    }
    __syncthreads();
    float s = lane < nc ? chunk[lane] : 0.f;
    return rsqrtf(dec_warp_sum(s) / n + eps);
}
template <typename T> __device__ void rope_kv_store(
        const float* q, const float* k, const float* v, float* q_out, T* Kc, T* Vc, float* ks,
        float* vs, const long long* pos_ptr, int H, int Hkv, int D, int Dv, int S_max, int n_rot,
        double base, double freq_scale, int neox, const float* qn, const float* kn, float eps) {
    __shared__ float row[DEC_MAX_ROW];
    __shared__ float wmax[DEC_ROPE_THREADS / 32];
    __shared__ float chunk[DEC_MAX_ROW / 32];
    const int b = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    long long pos = *pos_ptr;
    const float* src;
    const float* nw = nullptr;                     // this row's norm weights, if any
    float* fdst = nullptr;
    T* cdst = nullptr;
    float* sdst = nullptr;
    int n = D, rot = n_rot;
    if (b < H) {
        src = q + (long long)b * D;
        fdst = q_out + (long long)b * D;
        nw = qn;
    } else if (b < H + Hkv) {
        int h = b - H;
        src = k + (long long)h * D;
        cdst = Kc + ((long long)h * S_max + pos) * D;
        if (ks) sdst = ks + (long long)h * S_max + pos;
        nw = kn;
    } else {
        int h = b - H - Hkv;
        src = v + (long long)h * Dv;
        n = Dv;
        rot = 0;
        cdst = Vc + ((long long)h * S_max + pos) * Dv;
        if (vs) sdst = vs + (long long)h * S_max + pos;
    }
    // the normed value x * r * w, as rms_norm writes it, then rotated as the rope kernel reads it
    const float r = nw ? dec_rms_inv(src, n, eps, chunk) : 1.f;   // uniform over the block
    int half = rot / 2;
    for (int i = tid; i < half; i += nt) {
        // angles in double, the same expression as the rope kernel: long positions keep precision
        double ang = (double)pos * freq_scale * pow(base, -2.0 * i / rot), sd, cd;
        sincos(ang, &sd, &cd);
        float c = (float)cd, s = (float)sd;
        int a = neox ? i : 2 * i, bb = neox ? i + half : 2 * i + 1;
        float xa = src[a], xb = src[bb];
        if (nw) { xa = xa * r * nw[a]; xb = xb * r * nw[bb]; }
        row[a] = xa * c - xb * s;
        row[bb] = xa * s + xb * c;
    }
    for (int j = rot + tid; j < n; j += nt) row[j] = nw ? src[j] * r * nw[j] : src[j];
    __syncthreads();
    if (fdst) {
        for (int j = tid; j < n; j += nt) fdst[j] = row[j];
        return;
    }
    if (sdst == nullptr) {
        for (int j = tid; j < n; j += nt) dec_store(cdst + j, row[j]);
        return;
    }
    float amax = 0.f;
    for (int j = tid; j < n; j += nt) amax = fmaxf(amax, fabsf(row[j]));
    amax = dec_warp_max(amax);
    if ((tid & 31) == 0) wmax[tid >> 5] = amax;
    __syncthreads();
    for (int w = 0; w < nt / 32; ++w) amax = fmaxf(amax, wmax[w]);
    float sc = amax / 127.f;
    float div = sc > 0.f ? sc : 1.f;
    for (int j = tid; j < n; j += nt) dec_store(cdst + j, fminf(fmaxf(rintf(row[j] / div), -127.f), 127.f));
    if (tid == 0) *sdst = sc;
}
extern "C" __global__ void rope_kv_store_f16(const float* q, const float* k, const float* v,
        float* q_out, __half* Kc, __half* Vc, const long long* p, int H, int Hkv, int D, int Dv,
        int S, int n_rot, double base, double fs, int neox, const float* qn, const float* kn,
        float eps)
{ PDL_PROLOGUE(); rope_kv_store<__half>(q, k, v, q_out, Kc, Vc, nullptr, nullptr, p, H, Hkv, D, Dv, S, n_rot, base, fs, neox, qn, kn, eps); }
extern "C" __global__ void rope_kv_store_i8(const float* q, const float* k, const float* v,
        float* q_out, signed char* Kc, signed char* Vc, float* ks, float* vs, const long long* p,
        int H, int Hkv, int D, int Dv, int S, int n_rot, double base, double fs, int neox,
        const float* qn, const float* kn, float eps)
{ PDL_PROLOGUE(); rope_kv_store<signed char>(q, k, v, q_out, Kc, Vc, ks, vs, p, H, Hkv, D, Dv, S, n_rot, base, fs, neox, qn, kn, eps); }

// --- attention of one query token over keys 0..*pos (flash-decoding) ---------------------------
// Block (x = KV head hk and head group, y = split) serves up to DEC_GB query heads of KV head hk,
// so each K/V row is read once for all of them. The keys j0..pos are cut into the fewest splits
// of at least min_chunk keys (multiples of 16) that fit the grid's gridDim.y; blocks past the last
// split exit at once. A split walks its keys in tiles of DEC_TILE with a running max and sum.
// Scores: lpk lanes share one key row, 8 dims a lane (one wide load), eight keys a lane in flight,
// partial dots meet through shuffles. Values: Dv/8 lanes cover a row, the block's rows in
// parallel, eight rows a lane in flight. Each split writes its max, sum and weighted V; the block
// that finishes last (a counter per block column, reset by that block) merges them into out.
template <typename T> __device__ void attn_decode(
        const float* q, const T* K, const T* V, const float* ks, const float* vs, float* pm,
        float* pl, float* pacc, int* counters, float* out, const long long* pos_ptr, int H,
        int Hkv, int D, int Dv, int S_max, float scale, int window, int min_chunk) {
    __shared__ float qs[DEC_GB][DEC_MAX_D];
    __shared__ float sc[DEC_GB][DEC_TILE];
    __shared__ float part[DEC_THREADS * DEC_GB * 8];
    __shared__ float alpha[DEC_GB];
    __shared__ float wsplit[DEC_GB][DEC_MAX_SPLITS];
    __shared__ float inv_l[DEC_GB];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, NS = gridDim.y;
    const int G = H / Hkv, n_groups = (G + DEC_GB - 1) / DEC_GB;
    const int hk = blockIdx.x / n_groups, gb = blockIdx.x % n_groups;
    const int h0 = hk * G + gb * DEC_GB, ng = min(DEC_GB, G - gb * DEC_GB);
    const long long pos = *pos_ptr;
    const long long j0 = window > 0 ? max(0LL, pos - window + 1) : 0;
    const long long nk = pos + 1 - j0;
    long long chunk = (nk + NS - 1) / NS;
    chunk = max((long long)min_chunk, (chunk + 15) / 16 * 16);
    const int active = (int)((nk + chunk - 1) / chunk);
    const int split = blockIdx.y;
    if (split >= active) return;
    const long long lo = j0 + split * chunk, hi = min(pos + 1, lo + chunk);
    const long long slot = (long long)blockIdx.x * NS + split;

    for (int i = tid; i < DEC_GB * D; i += DEC_THREADS) {
        int g = i / D, d = i % D;
        qs[g][d] = g < ng ? q[(long long)(h0 + g) * D + d] : 0.f;
    }
    __syncthreads();
    int lpk = 1;                                   // lanes a key row: 8 dims each, a power of 2
    while (lpk * 8 < D) lpk <<= 1;
    const int kpw = 32 / lpk, li = lane % lpk, d0 = li * 8, sub = lane / lpk;
    const int kstep = 4 * kpw;                     // keys a block pass covers (four warps)
    float qr[DEC_GB][8];
    for (int g = 0; g < DEC_GB; ++g)
        for (int i = 0; i < 8; ++i) qr[g][i] = d0 < D ? qs[g][d0 + i] : 0.f;
    const int vl = Dv / 8, R = DEC_THREADS / vl;   // lanes a V row, V rows at once
    const int vr = tid / vl, vc = (tid % vl) * 8;
    float acc[DEC_GB][8];
    for (int g = 0; g < DEC_GB; ++g)
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    float m_run = NEG_INF, l_run = 0.f;            // warp g keeps head g's

    for (long long t0 = lo; t0 < hi; t0 += DEC_TILE) {
        const int tn = (int)min((long long)DEC_TILE, hi - t0);
        const T* Kt = K + ((long long)hk * S_max + t0) * D;
        for (int base = 0; base < tn; base += DEC_UNROLL * kstep) {   // uniform over the warp
            Raw8<T> raw[DEC_UNROLL] = {};
            int j[DEC_UNROLL];
            #pragma unroll
            for (int u = 0; u < DEC_UNROLL; ++u) {
                j[u] = base + u * kstep + warp * kpw + sub;
                if (j[u] < tn && d0 < D) dec_raw(Kt + (long long)j[u] * D + d0, raw[u]);
            }
            #pragma unroll
            for (int u = 0; u < DEC_UNROLL; ++u) {
                float f[8], s[DEC_GB];
                dec_cvt(raw[u], f);
                for (int g = 0; g < DEC_GB; ++g) {
                    float a = 0.f;
                    for (int i = 0; i < 8; ++i) a = fmaf(qr[g][i], f[i], a);
                    for (int o = lpk >> 1; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffff, a, o);
                    s[g] = a;
                }
                if (li == 0 && j[u] < tn) {
                    float kscale = ks ? ks[(long long)hk * S_max + t0 + j[u]] * scale : scale;
                    for (int g = 0; g < DEC_GB; ++g) sc[g][j[u]] = s[g] * kscale;
                }
            }
        }
        __syncthreads();
        if (warp < ng) {                           // softmax bookkeeping of head `warp`
            float m = NEG_INF;
            for (int jj = lane; jj < tn; jj += 32) m = fmaxf(m, sc[warp][jj]);
            float m_new = fmaxf(m_run, dec_warp_max(m));
            float sum = 0.f;
            for (int jj = lane; jj < tn; jj += 32) {
                float p = __expf(sc[warp][jj] - m_new);
                sc[warp][jj] = p;
                sum += p;
            }
            float a = __expf(m_run - m_new);       // 0 on the first tile
            l_run = l_run * a + dec_warp_sum(sum);
            m_run = m_new;
            if (lane == 0) alpha[warp] = a;
        }
        __syncthreads();
        if (vr < R) {
            for (int g = 0; g < DEC_GB; ++g)
                for (int i = 0; i < 8; ++i) acc[g][i] *= g < ng ? alpha[g] : 0.f;
            const T* Vt = V + ((long long)hk * S_max + t0) * Dv + vc;
            const float* vst = vs ? vs + (long long)hk * S_max + t0 : nullptr;
            for (int jb = vr; jb < tn; jb += DEC_UNROLL * R) {
                Raw8<T> raw[DEC_UNROLL];
                #pragma unroll
                for (int u = 0; u < DEC_UNROLL; ++u) {
                    int jj = jb + u * R;
                    if (jj < tn) dec_raw(Vt + (long long)jj * Dv, raw[u]);
                }
                #pragma unroll
                for (int u = 0; u < DEC_UNROLL; ++u) {
                    int jj = jb + u * R;
                    if (jj >= tn) break;
                    float f[8];
                    dec_cvt(raw[u], f);
                    float vsc = vst ? vst[jj] : 1.f;
                    for (int g = 0; g < DEC_GB; ++g) {
                        float w = sc[g][jj] * vsc;
                        for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(w, f[i], acc[g][i]);
                    }
                }
            }
        }
        __syncthreads();                           // sc is rewritten by the next tile
    }

    // the R row groups of this block meet in shared memory; one split: that is the output,
    // else the partial goes to global memory
    if (vr < R)
        for (int g = 0; g < DEC_GB; ++g)
            for (int i = 0; i < 8; ++i) part[(tid * DEC_GB + g) * 8 + i] = acc[g][i];
    if (warp < ng && lane == 0) inv_l[warp] = 1.f / l_run;
    __syncthreads();
    for (int idx = tid; idx < ng * Dv; idx += DEC_THREADS) {
        int g = idx / Dv, d = idx % Dv, c = d / 8, i = d % 8;
        float a = 0.f;
        for (int r = 0; r < R; ++r) a += part[((r * vl + c) * DEC_GB + g) * 8 + i];
        if (active == 1) out[(long long)(h0 + g) * Dv + d] = a * inv_l[g];
        else pacc[(slot * DEC_GB + g) * Dv + d] = a;
    }
    if (active == 1) return;
    if (warp < ng && lane == 0) { pm[slot * DEC_GB + warp] = m_run; pl[slot * DEC_GB + warp] = l_run; }

    if (!dec_last_of_column(counters, active)) return;   // the last block merges the splits
    const long long col = (long long)blockIdx.x * NS;
    if (warp < ng) {
        float M = NEG_INF;
        for (int s = lane; s < active; s += 32) M = fmaxf(M, __ldcg(pm + (col + s) * DEC_GB + warp));
        M = dec_warp_max(M);
        float L = 0.f;
        for (int s = lane; s < active; s += 32) {
            float e = __expf(__ldcg(pm + (col + s) * DEC_GB + warp) - M);
            wsplit[warp][s] = e;
            L += e * __ldcg(pl + (col + s) * DEC_GB + warp);
        }
        L = dec_warp_sum(L);
        if (lane == 0) inv_l[warp] = 1.f / L;
    }
    __syncthreads();
    // four output values a thread, eight splits' loads in flight: the merge is the tail of the
    // launch (one block a column works while the rest of the GPU waits), so it must not wait on
    // one L2 round trip per split
    const long long split_stride = (long long)DEC_GB * Dv;
    for (int idx = tid; idx < ng * Dv / 4; idx += DEC_THREADS) {
        int g = idx * 4 / Dv, d = idx * 4 % Dv;
        const float* src = pacc + (col * DEC_GB + g) * Dv + d;
        float4 a = {0.f, 0.f, 0.f, 0.f};
        for (int sp = 0; sp < active; sp += 8) {
            float4 v[8];
            #pragma unroll
            for (int u = 0; u < 8; ++u)
                if (sp + u < active)
                    v[u] = __ldcg(reinterpret_cast<const float4*>(src + (sp + u) * split_stride));
            #pragma unroll
            for (int u = 0; u < 8; ++u) {
                if (sp + u >= active) break;
                float w = wsplit[g][sp + u];
                a.x = fmaf(w, v[u].x, a.x); a.y = fmaf(w, v[u].y, a.y);
                a.z = fmaf(w, v[u].z, a.z); a.w = fmaf(w, v[u].w, a.w);
            }
        }
        float il = inv_l[g];
        float4 o = {a.x * il, a.y * il, a.z * il, a.w * il};
        *reinterpret_cast<float4*>(out + (long long)(h0 + g) * Dv + d) = o;
    }
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 3) attn_decode_f16(const float* q, const __half* K, const __half* V,
        float* pm, float* pl, float* pacc, int* cnt, float* out, const long long* p, int H,
        int Hkv, int D, int Dv, int S, float scale, int win, int min_chunk)
{ PDL_PROLOGUE(); attn_decode<__half>(q, K, V, nullptr, nullptr, pm, pl, pacc, cnt, out, p, H, Hkv, D, Dv, S, scale, win, min_chunk); }
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 3) attn_decode_i8(const float* q, const signed char* K,
        const signed char* V, const float* ks, const float* vs, float* pm, float* pl, float* pacc,
        int* cnt, float* out, const long long* p, int H, int Hkv, int D, int Dv, int S,
        float scale, int win, int min_chunk)
{ PDL_PROLOGUE(); attn_decode<signed char>(q, K, V, ks, vs, pm, pl, pacc, cnt, out, p, H, Hkv, D, Dv, S, scale, win, min_chunk); }
"""
