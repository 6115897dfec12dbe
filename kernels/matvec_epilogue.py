"""Decode matvec with the next op folded into its end: one launch instead of two, a use (issue 4's
decode step: 10 launches a layer -> 8). CUDA C on kernels/matvec_cuda.py's register kernel (its
loop `mv_rows`, CONFIG's rows a CTA and prefetch), only the end differs:

  add        out = x @ W.T + res: the residual add after the attention-output and down products,
             so the next norm is a plain rms_norm and the separate add is gone.
  silu,      W = [gate; up] as the backend fuses them (rows = 2F): a CTA takes R/2 output units,
  gelu_tanh  i.e. gate rows u0.. and up rows F+u0.., and writes act(g) * u as (n, F): the FFN's
             activation, so act_mul is gone. No weight is reordered: only the CTA's row pointers.

  norm in    mvn (LITE_FOLD_NORM=1, lite/backends/cuda_norm.py): any of the above, or none (E = 0),
             of rms_norm(x) * g instead of x: the loop multiplies the x it loads by g and sums x^2
             (matvec_cuda.load_x's NI), the totals are scaled by rsqrt(mean + eps) before the end.
             Per 32-weight chunk and x row: 8 float4 loads of g, 32 FMUL + 32 FFMA, shared by the
             CTA's R rows (~0.25 instructions a weight more for Q4_K over ~4.7), against a launch.

The add and the activations are written as cupy_ops' (`a + b`, silu_mul, gelu_tanh_mul), so a
decode step's results do not depend on whether the epilogue ran (same fp32 operations in the same
order). Checked in CI by tests/test_matvec_epilogue.py through the g++ emulator, against NumPy.
Launches enqueue on the given stream and never synchronize the host: meant for captured graphs.
"""
import contextlib
import functools

import numpy as np

from lite.kernels import matvec_cuda as mc

EPILOGUES = {"add": 1, "silu": 2, "gelu_tanh": 3}

C_EPI = r"""
// mv with the next decode op folded into its end (one launch fewer a use, see EPILOGUES):
// E = 1: out = x @ W.T + res (the residual add after the attention-output and down products).
// E = 2 / 3: W is [gate; up] (rows = 2F); a CTA takes R/2 units, i.e. gate rows u0.. and up rows
// F+u0.., and writes act(g) * u, silu (2) or gelu_tanh (3), as (n, F): the FFN's activation.
// E = 0 (mvn only): out = the product. NI (mvn): x enters as rms_norm(x) * g, the norm folded in:
// the loop multiplies x by g and sums x^2 (load_x), each total is scaled by rsqrt(mean + eps).
// The arithmetic of the add and the activations is cupy_ops' (`a + b`, silu_mul, gelu_tanh_mul).
// The end of mve_run: total (thread r*N+n: row r, x n) through epilogue E into out.
template <int N, int R, int E>
__device__ __forceinline__ void mve_end(float total, float* __restrict__ out, int rows, int F, int H,
                                        int u0, const float* __restrict__ res) {
    if constexpr (E <= 1) {
        if (threadIdx.x < R * N) {
            const int r = threadIdx.x / N, n = threadIdx.x % N;
            const long long i = (long long)n * rows + u0 + r;
            if constexpr (E == 1) { if (u0 + r < rows) out[i] = total + res[i]; }
            else { if (u0 + r < rows) out[i] = total; }
        }
    } else {
        __shared__ float tot[R * N];
        if (threadIdx.x < R * N) tot[threadIdx.x] = total;
        __syncthreads();
        if (threadIdx.x < H * N) {
            const int r = threadIdx.x / N, n = threadIdx.x % N;
            const float g = tot[r * N + n], u = tot[(r + H) * N + n];
            float y;
            if constexpr (E == 2) y = g / (1.0f + expf(-g)) * u;
            else y = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
            if (u0 + r < F) out[(long long)n * F + u0 + r] = y;
        }
    }
}
template <class T, int N, int R, int P, int E, bool NI>
__device__ __forceinline__ void mve_run(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                        float* __restrict__ out, int rows, int cols,
                                        const float* __restrict__ res, const float* __restrict__ g, float eps) {
    constexpr int H = E >= 2 ? R / 2 : R;                 // output units a CTA
    const int F = E >= 2 ? rows / 2 : rows;               // output width
    const int u0 = blockIdx.x * H, nb = cols / T::BE, chunks = nb * T::CPB;
    const long long rb = (long long)nb * T::TS;
    const unsigned char* rowp[R];
    #pragma unroll
    for (int r = 0; r < R; r++)   // units past the end re-read the last one and are not written
        rowp[r] = w + ((long long)min(u0 + r % H, F - 1) + (r >= H ? F : 0)) * rb;
    float acc[R][N];
    float ss[N];                                          // NI: this thread's sums of x^2
    mv_rows<T, N, R, P, NI>(rowp, x, cols, chunks, acc, g, ss);
    __shared__ float red[4][R * N];
    if constexpr (NI) {           // the warps' sums of x^2, read after block_sum's __syncthreads
        __shared__ float sred[4][N];
        #pragma unroll
        for (int n = 0; n < N; n++) {
            float v = ss[n];
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if ((threadIdx.x & 31) == 0) sred[threadIdx.x >> 5][n] = v;
        }
        float total = block_sum<R, N>(acc, red);
        const int n = threadIdx.x % N;
        const float s = (sred[0][n] + sred[1][n]) + (sred[2][n] + sred[3][n]);
        total *= rsqrtf(s / cols + eps);
        mve_end<N, R, E>(total, out, rows, F, H, u0, res);
    } else {
        mve_end<N, R, E>(block_sum<R, N>(acc, red), out, rows, F, H, u0, res);
    }
}
template <class T, int N, int R, int P, int E>
__global__ void __launch_bounds__(128) mve(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                           float* __restrict__ out, int rows, int cols,
                                           const float* __restrict__ res) {
    mve_run<T, N, R, P, E, false>(w, x, out, rows, cols, res, nullptr, 0.f);
}
// mve of rms_norm(x) * g (eps): the norm folded in (LITE_FOLD_NORM=1, lite/backends/cuda_norm.py).
template <class T, int N, int R, int P, int E>
__global__ void __launch_bounds__(128) mvn(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                           float* __restrict__ out, int rows, int cols,
                                           const float* __restrict__ res, const float* __restrict__ g,
                                           float eps) {
    mve_run<T, N, R, P, E, true>(w, x, out, rows, cols, res, g, eps);
}
"""


def c_source():
    return mc.C_HEAD + mc.C_TYPES + mc.C_KERNEL + C_EPI


def kernel_name(qtype, n, rows_per_cta, prefetch, e, norm_in=False):
    return f"{'mvn' if norm_in else 'mve'}<TQ{qtype[1:]}, {n}, {rows_per_cta}, {prefetch}, {e}>"


def config(qtype, n):
    """(rows a CTA, prefetch): CONFIG's register kernel, at most 4 rows a CTA when n > 2 (as
    matvec_cuda._plan); always even, so a gated CTA takes R/2 units."""
    rows_per_cta, prefetch = mc.CONFIG[qtype]
    return (min(rows_per_cta, 4) if n > 2 else rows_per_cta), prefetch


@functools.lru_cache(maxsize=None)
def _kernel(device, name):
    import cupy
    return cupy.RawModule(code=c_source(), options=("--std=c++17",),
                          name_expressions=[name]).get_function(name)


def supports(qtype, blocks, x):
    """True when mve can take these device arrays (matvec_cuda's types and alignment)."""
    return mc.qualifies(qtype, blocks, x)


def launch(qtype, blocks, x, out, rows, cols, epilogue, res=None, stream=None, norm=None):
    """Enqueue mve on `stream`. blocks: W (rows, cols) as GGUF blocks, 1-D uint8; x (n, cols) f32
    C-contiguous. epilogue "add": out (n, rows) = x @ W.T + res, res (n, rows) f32 C-contiguous.
    "silu" / "gelu_tanh": rows = 2F, out (n, F) = act(x @ W[:F].T) * (x @ W[F:].T). None (only
    with norm): out (n, rows) = the product. norm (g, eps), g (cols,) f32 device array 16-byte
    aligned: the product is of rms_norm(x) * g instead of x (mvn, the norm folded in). One launch
    per matvec_cuda.C_MAX_N rows of x."""
    import cupy
    e = 0 if epilogue is None else EPILOGUES[epilogue]
    width = rows if e <= 1 else rows // 2
    if e == 1 and (res is None or res.shape != out.shape):
        raise ValueError("epilogue 'add' needs res shaped like out")
    if e >= 2 and rows % 2:
        raise ValueError(f"a gated epilogue needs [gate; up] rows (an even count), got {rows}")
    if e == 0 and norm is None:
        raise ValueError("no epilogue and no norm: that is matvec_cuda.launch")
    device = cupy.cuda.runtime.getDevice()
    extra = () if norm is None else (norm[0], np.float32(norm[1]))
    with stream if stream is not None else contextlib.nullcontext():
        for i in range(0, x.shape[0], mc.C_MAX_N):
            xs, os_ = x[i:i + mc.C_MAX_N], out[i:i + mc.C_MAX_N]
            rs = res[i:i + mc.C_MAX_N] if e == 1 else os_      # otherwise res is never read
            n = xs.shape[0]
            r, p = config(qtype, n)
            units = r if e <= 1 else r // 2
            func = _kernel(device, kernel_name(qtype, n, r, p, e, norm is not None))
            func(((width + units - 1) // units,), (mc.THREADS,),
                 (blocks, xs, os_, np.int32(rows), np.int32(cols), rs) + extra)
