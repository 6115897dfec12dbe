"""The tiled dequantize scheme every block type shares (dequant_basic.py, dequant_k.py).


Scheme: a thread block of THREADS threads owns one *tile* of whole quant blocks (THREADS * EPT *
GROUPS values). It first copies the tile's bytes into shared memory with wide coalesced loads (so
odd block sizes such as 18, 34 or 210 bytes cost nothing extra), then each thread decodes GROUPS
runs of EPT=8 consecutive values from shared memory and writes each run with one 16-byte store
(fp16) or two (fp32). Narrow global stores were what held a first Numba attempt at 25-30% of copy
bandwidth (shared device notes).

Every type's arithmetic exists twice, with the same operation order as gguf-py's reference:
  * a Numba device function `decode(sm, base, j, v)` (sm: the tile as uint32 words in shared
    memory, base: the block's byte offset in it, j: first value within the block, v: 8 float32
    out). This one runs under the simulator in CI and is the GPU reference;
  * a CUDA C device function `dec_<type>(const uchar* b, int j, float* v)` compiled with NVRTC
    (CuPy RawModule), which serves the GPU hot path: it reached the bar where Numba did not,
    and its launch costs ~7 us of host time against 50-200 us for a Numba launch.
Products and sums use explicitly rounded operations (fmul_rn/__fmul_rn) so that no multiply-add
is contracted into an FMA: results then equal the reference bit for bit.
reference=True (BackendConfig.reference_kernels) runs the Numba kernels on the GPU instead.
"""
import logging
import os

import numpy as np

from lite.errors import SettingError
from lite.kernels.util import SIMULATOR, numba_stream
from lite.kernels.cuda_source import source
from lite.kernels.registry import array_module, quant_info, register_dequant
from numba import cuda, float32, uint32

log = logging.getLogger(__name__)

THREADS = 256
EPT = 8

# ---------------------------------------------------------------- scalar helpers (Numba side)
if SIMULATOR:
    def _dev(f):
        return f

    def h2f(bits):
        return np.float32(np.uint16(bits).view(np.float16))

    def f2h(x):
        return int(np.float32(x).astype(np.float16).view(np.uint16))

    def u2f(bits):
        return np.uint32(bits).view(np.float32)

    def mul(a, b):
        return np.float32(np.float32(a) * np.float32(b))

    def add(a, b):
        return np.float32(np.float32(a) + np.float32(b))

    def sub(a, b):
        return np.float32(np.float32(a) - np.float32(b))
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda import libdevice
    from numba.cuda.extending import intrinsic

    def _dev(f):
        return cuda.jit(device=True, inline=True)(f)

    @intrinsic
    def h2f(typingctx, bits):
        def codegen(context, builder, sig, args):
            v = builder.trunc(args[0], ir.IntType(16)) if args[0].type.width > 16 else args[0]
            return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())
        return types.float32(bits), codegen

    @intrinsic
    def f2h(typingctx, x):
        def codegen(context, builder, sig, args):
            h = builder.fptrunc(args[0], ir.HalfType())     # cvt.rn.f16.f32: round to nearest even
            return builder.zext(builder.bitcast(h, ir.IntType(16)), ir.IntType(64))
        return types.uint64(types.float32), codegen

    @intrinsic
    def u2f(typingctx, bits):
        def codegen(context, builder, sig, args):
            v = builder.trunc(args[0], ir.IntType(32)) if args[0].type.width > 32 else args[0]
            return builder.bitcast(v, ir.FloatType())
        return types.float32(bits), codegen

    mul = _dev(lambda a, b: libdevice.fmul_rn(a, b))
    add = _dev(lambda a, b: libdevice.fadd_rn(a, b))
    sub = _dev(lambda a, b: libdevice.fsub_rn(a, b))


@_dev
def b8(sm, i):
    """Byte i of the tile, as a signed 64-bit integer (so that later subtractions never wrap)."""
    return np.int64((sm[i >> 2] >> ((i & 3) * 8)) & 0xFF)


@_dev
def u16(sm, i):
    """Little-endian uint16 at byte i (any alignment)."""
    return b8(sm, i) | (b8(sm, i + 1) << 8)


@_dev
def s8(x):
    return (x ^ 0x80) - 0x80


@_dev
def mxfp4_value(n):
    # e2m1 values doubled, 0,1,2,3,4,6,8,12 by the low 3 bits, packed one per byte.
    mag = (0x0C08060403020100 >> ((n & 7) * 8)) & 0xFF
    return np.float32(-mag) if n & 8 else np.float32(mag)


# ---------------------------------------------------------------- the shared CUDA C pieces
# One tile: stage bytes in shared memory with 16-byte loads (byte loads if the source is not
# 16-byte aligned, e.g. an odd slice), then decode GROUPS runs of 8 values a thread.
C_KERNEL = source("dequant_tile.cu")
C_STORE_F16 = source("dequant_store_f16.cuh")
C_STORE_F32 = source("dequant_store_f32.cuh")


def _groups(tb, be):
    """Runs of 8 per thread so that a tile holds about 4-9 KiB of input bytes in flight."""
    per_group_bytes = THREADS * EPT * tb // be
    return max(1, min(4, 6144 // per_group_bytes))


def c_source(name, tb, be, c_decode=None):
    """CUDA C for one type: the common helpers and the decoders (kernels/cuda/dequant_decoders.cuh: dec_<type>)
    and the tile kernel (dequant_tile.cu) for f16 and f32 output, its placeholders filled in. (c_decode:
    unused, for callers that passed DequantKernel.c_decode.)"""
    groups = _groups(tb, be)
    tile_elems = THREADS * EPT * groups
    tile_bytes = tile_elems // be * tb
    defs = {"NAME": name.lower(), "THREADS": str(THREADS), "GROUPS": str(groups), "TB": str(tb),
            "BE": str(be), "TILE_ELEMS": str(tile_elems), "TILE_BYTES": str(tile_bytes),
            "VEC_PER_THREAD": str(-(-tile_bytes // (16 * THREADS)))}
    src = source("dequant_decoders.cuh")
    for out_name, out_t, store in (("f16", "unsigned short", C_STORE_F16), ("f32", "float", C_STORE_F32)):
        k = C_KERNEL.replace("STORE", store).replace("OUT_T", out_t).replace("_OUT(", f"_{out_name}(")
        for key, val in defs.items():
            k = k.replace(key, val)
        src += k
    return src


# ---------------------------------------------------------------- the Numba kernels
def make_numba_kernels(tb, be, decode):
    """(f16 kernel, f32 kernel) for a type: src is the input as uint32 words; the f16 kernel
    writes 4 values per uint64 (out viewed as uint64), the f32 kernel float32."""
    groups = _groups(tb, be)
    tile_elems = THREADS * EPT * groups
    tile_words = tile_elems // be * tb // 4
    loads = -(-tile_words // THREADS)

    @_dev
    def stage(src, nwords, sm):
        w0 = cuda.blockIdx.x * tile_words
        for k in range(loads):
            i = cuda.threadIdx.x + k * THREADS
            if i < tile_words and w0 + i < nwords:
                sm[i] = src[w0 + i]
        cuda.syncthreads()

    @cuda.jit
    def k16(src, nwords, out64, n):
        sm = cuda.shared.array(tile_words, uint32)
        stage(src, nwords, sm)
        v = cuda.local.array(EPT, float32)
        for grp in range(groups):
            le = (grp * THREADS + cuda.threadIdx.x) * EPT
            e = cuda.blockIdx.x * tile_elems + le
            if e < n:
                lb = le // be
                decode(sm, lb * tb, le - lb * be, v)
                o = e >> 2
                out64[o] = f2h(v[0]) | (f2h(v[1]) << 16) | (f2h(v[2]) << 32) | (f2h(v[3]) << 48)
                out64[o + 1] = f2h(v[4]) | (f2h(v[5]) << 16) | (f2h(v[6]) << 32) | (f2h(v[7]) << 48)

    @cuda.jit
    def k32(src, nwords, out, n):
        sm = cuda.shared.array(tile_words, uint32)
        stage(src, nwords, sm)
        v = cuda.local.array(EPT, float32)
        for grp in range(groups):
            le = (grp * THREADS + cuda.threadIdx.x) * EPT
            e = cuda.blockIdx.x * tile_elems + le
            if e < n:
                lb = le // be
                decode(sm, lb * tb, le - lb * be, v)
                for i in range(EPT):
                    out[e + i] = v[i]

    return k16, k32, tile_elems


# ---------------------------------------------------------------- launchers
class DequantKernel:
    """Both implementations of one type's dequantize, compiled lazily on first use."""

    def __init__(self, name, decode):
        info = quant_info(name)
        self.name, self.tb, self.be = info.name, info.type_size, info.block_elems
        self.decode = decode
        self.c_decode = None          # (the CUDA C decoder is dec_<type> in dequant_decoders.cuh)
        self._numba = None
        self._raw = None

    def numba_kernels(self):
        if self._numba is None:
            self._numba = make_numba_kernels(self.tb, self.be, self.decode)
        return self._numba

    def raw_kernels(self):
        if self._raw is None:
            import cupy
            mod = cupy.RawModule(code=c_source(self.name, self.tb, self.be),
                                 options=("--std=c++17", "--ftz=false", "--fmad=false"))
            n = self.name.lower()
            self._raw = (mod.get_function(f"deq_{n}_f16"), mod.get_function(f"deq_{n}_f32"))
        return self._raw

    def tile_elems(self):
        return THREADS * EPT * _groups(self.tb, self.be)

    def __call__(self, blocks, out, stream, reference=False):
        """The CUDA C kernel on a GPU; the Numba one with reference (and in the simulator)."""
        self.launch(blocks, out, stream, "numba" if SIMULATOR or reference else "cuda")

    def launch(self, blocks, out, stream, impl):
        if blocks.dtype != np.uint8 or blocks.ndim != 1 or blocks.size % self.tb:
            raise ValueError(f"{self.name}: blocks must be whole {self.tb}-byte blocks as 1-D uint8")
        n = blocks.size // self.tb * self.be
        if out.shape != (n,) or out.dtype not in (np.float16, np.float32):
            raise ValueError(f"{self.name}: out must be ({n},) float16/float32, got {out.shape} {out.dtype}")
        if n == 0:
            return
        grid = -(-n // self.tile_elems())
        if impl == "cuda":
            k16, k32 = self.raw_kernels()
            kern = k16 if out.dtype == np.float16 else k32
            with stream if stream is not None else _null_ctx():
                kern((grid,), (THREADS,), (blocks, np.int64(blocks.size), out, np.int64(n)))
            return
        self._launch_numba(blocks, out, n, grid, stream)

    def _launch_numba(self, blocks, out, n, grid, stream):
        xp = array_module(blocks)
        src = blocks
        if blocks.size % 4 or _ptr(blocks) % 4:
            src = xp.zeros(-(-blocks.size // 4) * 4, dtype=np.uint8)
            src[:blocks.size] = blocks
        k16, k32, _ = self.numba_kernels()
        # A partial run of 8 at the end (float types only) is written to a padded temporary.
        target = out if n % EPT == 0 and _ptr(out) % 8 == 0 else xp.empty(-(-n // EPT) * EPT, out.dtype)
        s = numba_stream(stream)
        words = src.view(np.uint32)
        if out.dtype == np.float16:
            k16[grid, THREADS, s](words, words.size, target.view(np.uint64), n)
        else:
            k32[grid, THREADS, s](words, words.size, target, n)
        if target is not out:
            out[:] = target[:n]


class _null_ctx:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _ptr(a):
    if type(a).__module__.startswith("cupy"):
        return a.data.ptr
    return a.ctypes.data


KERNELS = {}


def define(name, decode):
    """Create and register the dequantize launcher for one type (decode: its Numba decoder; the CUDA C
    one is dec_<type> in kernels/cuda/dequant_decoders.cuh)."""
    k = DequantKernel(name, decode)
    KERNELS[k.name] = k
    register_dequant(k.name)(k)
    return k
