"""Run the CUDA C of kernels/cupy_*.py on the host, one std::thread per GPU thread.

CuPy RawKernels have no simulator (Numba's covers only Numba kernels), and GPU time is scarce, so
the tests compile the very same kernel text with g++ against a small CUDA emulation: blocks run
one after another (so `static` stands in for __shared__), the threads of a block run at once and
meet at __syncthreads (a std::barrier) and __shfl_xor_sync (a barrier per warp). Enough for
correctness, nothing about speed; atomics across blocks are trivially ordered here. __half is
_Float16; the half2 arithmetic (__hfma2, __hsub2, ...) rounds each result once, as the GPU does.

    lib = compile_kernels(SOURCE)                 # needs g++ with C++20
    lib.launch("kernel_name", grid, block, arg0, arg1, ...)   # numpy arrays, numpy scalars, None

    with emulated_kernels("small_ops") as mods:   # lite.kernels modules against a NumPy `cupy`
        mods["small_ops"].rms_norm(x, w, 1e-5, None)
"""
import contextlib
import ctypes
import functools
import hashlib
import importlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

import numpy as np

HEADER = r"""
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
#define __launch_bounds__(...)
struct dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
struct __half {
    _Float16 v;
    __half() = default;
    __half(float f) : v((_Float16)f) {}
    operator float() const { return (float)v; }
};
struct __half2 { __half x, y; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
inline float2 __half22float2(__half2 h) { return {(float)h.x, (float)h.y}; }
inline __half __float2half(float f) { return __half(f); }
inline float __half2float(__half h) { return (float)h; }
inline float2 make_float2(float a, float b) { return {a, b}; }
// half2 arithmetic, each result rounded once to fp16 as the GPU's f16x2 instructions do (the exact
// value in double first: products of two halves have 22 bits and the sums stay within 53 bits).
inline __half round_to_half(double v) { __half h; h.v = (_Float16)v; return h; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
    return {round_to_half((double)a.x * (double)b.x + (double)c.x), round_to_half((double)a.y * (double)b.y + (double)c.y)}; }
inline __half2 __hsub2(__half2 a, __half2 b) {
    return {round_to_half((double)a.x - (double)b.x), round_to_half((double)a.y - (double)b.y)}; }
inline __half2 __hadd2(__half2 a, __half2 b) {
    return {round_to_half((double)a.x + (double)b.x), round_to_half((double)a.y + (double)b.y)}; }
inline __half2 __hmul2(__half2 a, __half2 b) {
    return {round_to_half((double)a.x * (double)b.x), round_to_half((double)a.y * (double)b.y)}; }
inline __half2 __floats2half2_rn(float lo, float hi) { return {__half(lo), __half(hi)}; }
inline float __low2float(__half2 h) { return (float)h.x; }
inline float __high2float(__half2 h) { return (float)h.y; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __expf(float x) { return expf(x); }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline void sincos(double x, double* s, double* c) { *s = std::sin(x); *c = std::cos(x); }
template <class A> inline A max(A a, A b) { return a > b ? a : b; }
template <class A> inline A min(A a, A b) { return a < b ? a : b; }
template <class A> inline A __ldcg(const A* p) { return *p; }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

struct WarpState { std::barrier<>* bar; unsigned long long buf[32]; unsigned mma[32][6]; };   // mma: kernels/matvec_mma.py's fragments
thread_local std::barrier<>* tl_block_bar;
thread_local WarpState* tl_warp;
inline void __syncthreads() { tl_block_bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffff) { tl_warp->bar->arrive_and_wait(); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int o) {
    static_assert(sizeof(T) <= 8, "shuffle of a scalar");
    int lane = threadIdx.x & 31;
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    tl_warp->buf[lane] = bits;
    tl_warp->bar->arrive_and_wait();
    bits = tl_warp->buf[lane ^ o];
    tl_warp->bar->arrive_and_wait();
    T r;
    std::memcpy(&r, &bits, sizeof(T));
    return r;
}

// every block in turn; its threads at once, each dropping out of the barriers when it returns
static void emu_launch(dim3 grid, dim3 block, const std::function<void()>& body) {
    gridDim = grid; blockDim = block;
    unsigned n = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::barrier<> block_bar(n);
        std::vector<std::barrier<>*> warp_bars;
        std::vector<WarpState> warps((n + 31) / 32);
        for (unsigned w = 0; w < warps.size(); ++w)
            warps[w].bar = new std::barrier<>(std::min(32u, n - 32 * w));
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < n; ++t) {
            threads.emplace_back([&, t] {
                blockIdx = {bx, by, bz};
                threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                tl_block_bar = &block_bar;
                tl_warp = &warps[t / 32];
                body();
                tl_warp->bar->arrive_and_drop();
                block_bar.arrive_and_drop();
            });
        }
        for (auto& th : threads) th.join();
        for (auto& w : warps) delete w.bar;
    }
}
"""

# More intrinsics the decode products use (fp16 bits, popc, byte_perm, funnel shifts, __ldg), for a test
# to put before its kernels: `compile_kernels(HOST_SHIMS + SOURCE)`. Not in HEADER: some tests bring
# their own __popc.
HOST_SHIMS = r"""
#define LITE_HOST_SHIM
inline float half_bits_to_float(unsigned short h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
inline float h2f(unsigned short h) { return half_bits_to_float(h); }
inline unsigned short f2h(float v) { _Float16 f = (_Float16)v; unsigned short h; std::memcpy(&h, &f, 2); return h; }
inline unsigned __popc(unsigned v) { return __builtin_popcount(v); }
inline unsigned ksign(unsigned s7) { return s7 | ((__popc(s7) & 1u) << 7); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {   // selectors here never set bit 3
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
    return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (s & 31)); }
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (s < 32 ? s : 32)); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
"""

_SIGNATURE = re.compile(
    r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)')


def _wrappers(source):
    """One extern "C" launch_<name>(grid, block, void** args) per kernel of the source."""
    out = []
    for name, params in _SIGNATURE.findall(source):
        types = [re.sub(r"\s*\b\w+\s*$", "", p.strip()) for p in params.split(",")]
        call = ", ".join(f"*({t}*)a[{i}]" for i, t in enumerate(types))
        out.append(f'extern "C" void launch_{name}(unsigned gx, unsigned gy, unsigned bx, void** a)'
                   f' {{ emu_launch({{gx, gy, 1}}, {{bx, 1, 1}}, [&] {{ {name}({call}); }}); }}')
    return "\n".join(out)


@functools.lru_cache(maxsize=None)
def available():
    """g++ that builds C++20 <barrier> code (GCC 11 or newer)."""
    if shutil.which("g++") is None:
        return False
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "probe.cpp"
        src.write_text("#include <barrier>\nint main() { std::barrier<> b(1); b.arrive_and_wait(); }\n")
        probe = subprocess.run(["g++", "-std=c++20", "-pthread", "-o", str(Path(d) / "probe"),
                                str(src)], capture_output=True)
    return probe.returncode == 0


_LAUNCH_LOCK = threading.Lock()


class Kernels:
    def __init__(self, path):
        self._lib = ctypes.CDLL(str(path))

    def launch(self, name, grid, block, *args):
        """args: numpy arrays (passed by address), numpy scalars (by value), None (null pointer)."""
        grid = tuple(grid) + (1,) * (2 - len(grid))
        keep = []
        for a in args:
            if a is None:
                keep.append(ctypes.c_void_p(0))
            elif isinstance(a, np.ndarray):
                assert a.flags.c_contiguous, "kernels take contiguous arrays"
                keep.append(ctypes.c_void_p(a.ctypes.data))
            else:
                keep.append(np.array([a]))          # its dtype is the C type of the parameter
        ptrs = (ctypes.c_void_p * len(keep))(*[
            ctypes.addressof(k) if isinstance(k, ctypes.c_void_p) else k.ctypes.data for k in keep])
        fn = getattr(self._lib, f"launch_{name}")
        with _LAUNCH_LOCK:          # the launch dimensions are globals: stages' threads take turns
            fn(ctypes.c_uint(grid[0]), ctypes.c_uint(grid[1]), ctypes.c_uint(block[0]), ptrs)


# -fno-gnu-unique: a static (the emulated __shared__) in an inline or template function would
# otherwise be one object for the whole process, shared by every kernel library loaded
GXX_FLAGS = ("-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", "-fno-gnu-unique")


def compile_kernels(source):
    """Build (once per source text) and load the emulated kernels of a CUDA C source."""
    text = HEADER + source + "\n" + _wrappers(source)
    digest = hashlib.sha256(" ".join(GXX_FLAGS + (text,)).encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / "lite_cuda_emu"
    cache.mkdir(exist_ok=True)
    lib = cache / f"{digest}.so"
    if not lib.exists():
        src = cache / f"{digest}.cpp"
        src.write_text(text)
        tmp = cache / f"{digest}.{id(text)}.so"
        subprocess.run(["g++", *GXX_FLAGS, "-o", str(tmp), str(src)], check=True)
        tmp.replace(lib)
    return Kernels(lib)


# --- a NumPy-backed `cupy` whose RawModule compiles here, for the kernels' real Python wrappers ---
class RawModule:
    def __init__(self, code, options=()):
        self._lib = compile_kernels(code.replace("#include <cuda_fp16.h>\n", ""))

    def get_function(self, name):
        def launch(grid, block, args, stream=None, shared_mem=0):
            self._lib.launch(name, grid, block, *args)
        return launch


def poisoned(alloc):
    """An allocator whose memory starts as NaN bytes, so reading what no kernel wrote shows."""
    def make(*args, **kw):
        a = alloc(*args, **kw)
        a.view(np.uint8)[...] = 0xFF
        return a
    return make


def fake_cupy(**extra):
    """A stand-in `cupy` module: NumPy arrays, RawModule emulated, ElementwiseKernel a stub (None:
    those kernels are not emulated); `extra` adds attributes."""
    fake = types.ModuleType("cupy")
    fake.empty, fake.empty_like, fake.zeros = poisoned(np.empty), poisoned(np.empty_like), np.zeros
    fake.RawModule = RawModule
    fake.ElementwiseKernel = lambda *a, **k: None
    vars(fake).update(extra)
    return fake


@contextlib.contextmanager
def emulated_kernels(*names, **extra):
    """{name: lite.kernels.<name>} freshly imported against fake_cupy(**extra). On exit the real
    modules and the package's attributes are back (a GPU run of later tests must not find these
    stand-ins); the modules handed out keep working on the fake."""
    import lite.kernels as package
    full = ("cupy",) + tuple("lite.kernels." + n for n in names)
    saved = {n: sys.modules.pop(n, None) for n in full}
    saved_attrs = {n: vars(package).get(n) for n in names}
    sys.modules["cupy"] = fake_cupy(**extra)
    try:
        yield {n: importlib.import_module("lite.kernels." + n) for n in names}
    finally:
        for n, m in saved.items():
            sys.modules.pop(n, None)
            if m is not None:
                sys.modules[n] = m
        for n, m in saved_attrs.items():
            if m is None:
                vars(package).pop(n, None)
            else:
                setattr(package, n, m)
