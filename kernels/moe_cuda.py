"""Grouped Mixture-of-Experts kernels in CUDA C (CuPy RawModule), with NumPy twins of their index logic.

A layer's MoE work is a constant number of launches whatever the number of experts (DESIGN.md,
"Experts"); nothing here synchronizes the host, so a decode step stays capturable in a CUDA graph.
  moe_logits   router logits for a few tokens (a warp a dot product; cuBLAS does large T)
  moe_topk     softmax over the experts, top-k (ties: lower index first, as np.argsort stable on -p),
               renormalize: a warp a token -> ids (T, k) int32, weights (T, k) f32
  moe_align    one CTA: counts per expert, each expert's rows padded to a multiple of `bm` (a
               "block" of bm slots, all one expert), the stable position of every token-slot in that
               padded order (pos), the token of every padded row (blk_rows, -1 = padding) and the
               expert of every block (blk_expert, -1 = unused). Deterministic: ranks come from warp
               match masks and per-warp counts, never from atomics' order.
  moe_mv       fused dequantize-and-dot over blocks: a CTA takes R weight rows of one block's expert
               and the block's N token rows (N=1 and blk_rows=NULL: block b is the token-slot pair b,
               its token b / k, no sort needed - the decode case). blockIdx.z picks gate or up, so
               both run in one launch. The per-type decode is kernels/matvec_cuda.py's (same structs);
               IQ3_XXS takes kernels/matvec_iq.py's TIQ3_XXS, IQ4_XS moe_cuda_src.py's TIQ4_XS (their
               tables compiled into the module, filled into shared memory by T::init). The IQ
               variants passed their GPU tests in sessions 3 and 4 (tests/test_experts_iq.py);
               tests/test_moe_mv_emulated.py runs their CUDA C on the host (g++) against float64
               products of gguf-py's dequantize, in CI. Decode (n = 1) takes
               kernels/moe_mvw.py's moe_mvw.
  deq_gather   dequantize the used experts (sel[y], y = blockIdx.y) of a 3-D tensor to fp16, one
               launch: kernels/dequant_basic.py's tiled kernel with a second grid dimension.
  moe_gather_x16, moe_act_{f32,f16}, moe_ptrs, moe_combine: the cuBLAS path's glue (rows to fp16
               in padded order; activation; device pointer arrays for cublasGemmBatchedEx; the
               weighted sum of each token's k expert outputs, gathered, not scattered with atomics).
The twins (route_ref, align_ref, combine_ref) define what the kernels must produce; CI checks them
against the CPU backend, GPU tests check the kernels against them.
"""
import functools

import numpy as np

MAX_EXPERTS = 512          # moe_align's shared arrays and moe_topk's registers are sized for this
ALIGN_THREADS = 512

from lite.kernels.cuda_source import source  # noqa: E402
from lite.kernels.pdl import call as pdl_call, source_head  # noqa: E402

C_MOE = source("moe_layer.cu")                 # routing, top-k, the expert sort, combine, GEMM glue
C_MV = source("moe_sorted_product.cuh")        # the product over expert-sorted blocks
C_TIQ4_XS = source("moe_iq4_xs.cuh")           # IQ4_XS as a type of the products


_DEQ_SIG = "const uchar* __restrict__ src, long long nbytes, OUT_T* __restrict__ out, long long n) {"
_DEQ_GATHER_SIG = ("const uchar* __restrict__ src0, long long nbytes, OUT_T* __restrict__ out0, long long n,\n"
                   "        const int* __restrict__ sel, const int* __restrict__ slot_of) {\n"
                   "    const int e_ = sel[blockIdx.y];\n"
                   "    const int s_ = e_ < 0 ? -1 : (slot_of ? slot_of[e_] : e_);\n"
                   "    if (s_ < 0) return;\n"
                   "    const uchar* src = src0 + (long long)s_ * nbytes;\n"
                   "    OUT_T* out = out0 + (long long)blockIdx.y * n;")

IQ_MV_TYPES = ("IQ3_XXS", "IQ4_XS")   # struct TIQ3_XXS of kernels/matvec_iq.py, TIQ4_XS of moe_cuda_src
MV_TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K") + IQ_MV_TYPES   # those of kernels/matvec_cuda.py, IQ
MV_N = 8                   # token rows a sorted block (short prefill; decode takes moe_mvw)
MV_ROWS = 2                # rows a CTA: R * N accumulators, N=8 with R=4 spills (ptxas -v, sm_90)
# Byte alignment the structs' loads need of an expert's blocks (base and expert stride):
# IQ3_XXS blocks (98 bytes) are read in 16-bit halves, IQ4_XS (136) in 8-byte pairs of words.
_IQ_ALIGN = {"IQ3_XXS": 2, "IQ4_XS": 8}


def mv_align(qtype):
    from lite.kernels import matvec_cuda
    return _IQ_ALIGN[qtype] if qtype in _IQ_ALIGN else matvec_cuda.ALIGN[qtype]


def mv_fits(qtype, base_ptr, ebytes):
    """Can moe_mv read experts of `qtype` at base_ptr, ebytes apart (its loads' alignment)?"""
    a = mv_align(qtype) if qtype in MV_TYPES else 0
    return a > 0 and base_ptr % a == 0 and ebytes % a == 0


def mv_source(qtype="Q4_K", host=False):
    """CUDA C holding moe_mv and the struct of `qtype`. host: without the device-only helpers
    (inline PTX), for the emulator tests, which put host stand-ins first."""
    from lite.kernels import matvec_cuda
    if qtype not in IQ_MV_TYPES:
        return matvec_cuda.C_HEAD + matvec_cuda.C_TYPES + C_MV
    from lite.kernels import dequant_iq, iq_tables, matvec_iq
    kv = ", ".join(str(int(v)) for v in iq_tables.KVALUES_IQ4)
    # The grid and the levels are compiled into the module (as matvec_iq.c_source does), so each
    # device gets its own copy with the module: no table argument. C_IQ3_XXS brings the macros
    # TIQ3_XXS uses (GCOPIES, GB, SX); C_COMMON's `#define R 4` is undone before moe_mv<.., R>.
    return ((("" if host else dequant_iq.C_HELPERS) + dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS")
             + f"__device__ const int IQ4_KVALUES[16] = {{{kv}}};\n" + matvec_cuda.C_HEAD
             + matvec_iq.C_COMMON + matvec_iq.C_IQ3_XXS + "#undef R\n" + matvec_iq.C_IQ3_XXS_STAGED
             + C_TIQ4_XS + C_MV))


def mv_struct(qtype):
    """The decode struct of a type: matvec_cuda's (decode_struct), or the IQ types' own."""
    from lite.kernels import matvec_cuda
    return f"T{qtype}" if qtype in IQ_MV_TYPES else matvec_cuda.decode_struct(qtype)


def mv_name(qtype):
    return f"moe_mv<{mv_struct(qtype)}, {MV_N}, {MV_ROWS}>"


def _tiled():
    """The module holding the tiled dequantize scheme (KERNELS, C_KERNEL, c_source)."""
    from lite.kernels import dequant_common
    return dequant_common


def gather_dequant_source(qtype):
    """CUDA C of the gathered dequantize for a type the tiled scheme serves, or None (then the
    caller dequantizes the whole 3-D tensor with kernels.dequantize: one launch all the same)."""
    tiled = _tiled()
    k = getattr(tiled, "KERNELS", {}).get(qtype)
    if k is None or _DEQ_SIG not in getattr(tiled, "C_KERNEL", ""):
        return None
    src = tiled.c_source(k.name, k.tb, k.be, k.c_decode)
    return src.replace(_DEQ_SIG.replace("OUT_T", "unsigned short"),
                       _DEQ_GATHER_SIG.replace("OUT_T", "unsigned short")).replace(
                       _DEQ_SIG.replace("OUT_T", "float"), _DEQ_GATHER_SIG.replace("OUT_T", "float"))


# ---------------------------------------------------------------- compiled modules (per device)
@functools.lru_cache(maxsize=None)
def _moe_module(device, head=""):
    import cupy
    names = [f"moe_topk<{v}>" for v in (1, 2, 4, 8, 16)]
    return cupy.RawModule(code=head + C_MOE, options=("--std=c++17",), name_expressions=names)


@functools.lru_cache(maxsize=None)
def _mv_kernel(device, qtype, name):
    import cupy
    mod = cupy.RawModule(code=mv_source(qtype), options=("--std=c++17",), name_expressions=[name])
    return mod.get_function(name)


@functools.lru_cache(maxsize=None)
def _gather_dequant_kernel(device, qtype):
    import cupy
    src = gather_dequant_source(qtype)
    if src is None:
        return None
    mod = cupy.RawModule(code=src, options=("--std=c++17", "--ftz=false", "--fmad=false"))
    k = _tiled().KERNELS[qtype]
    return mod.get_function(f"deq_{k.name.lower()}_f16"), k.tile_elems()


def _dev():
    import cupy
    return cupy.cuda.runtime.getDevice()


def fn(name, pdl=False):
    """A kernel of the routing module; pdl: the module compiled with LT_PDL (a separate one)."""
    return _moe_module(_dev(), source_head(pdl)).get_function(name)


def topk_fn(n_expert, pdl=False):
    v = next(v for v in (1, 2, 4, 8, 16) if 32 * v >= n_expert)
    return fn(f"moe_topk<{v}>", pdl)


def mv_kernel(qtype):
    return _mv_kernel(_dev(), qtype, mv_name(qtype))


def gather_dequant_kernel(qtype):
    """(kernel, tile_elems) or None when the type has no CUDA C dequantize to gather with (the tiled
    scheme's types, and IQ3_XXS's own kernel: kernels/dequant_iq3_cuda.py)."""
    if qtype == "IQ3_XXS":
        from lite.kernels import dequant_iq3_cuda
        return dequant_iq3_cuda.gather_kernel(_dev())
    return _gather_dequant_kernel(_dev(), qtype)


# ---------------------------------------------------------------- NumPy twins (the contract)
def route_ref(logits, k, normalize):
    """What moe_topk computes: softmax, the k largest (lower index first on ties), renormalized."""
    logits = np.asarray(logits, np.float32)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, axis=-1)
    if normalize:
        w = w / w.sum(axis=-1, keepdims=True)
    return ids.astype(np.int32), w.astype(np.float32)


def nb_max(S, n_expert, bm):
    """Blocks moe_align may fill: sum over experts of ceil(count / bm) <= ceil(S / bm) + used."""
    return -(-S // bm) + min(n_expert, S)


def align_ref(ids, n_expert, bm):
    """What moe_align computes, from (T, k) ids: dict of blk_expert (nb_max,), blk_rows
    (nb_max*bm,), pos (S,), used_list (n_expert,), rank (n_expert,), n_blocks, n_used."""
    ids = np.asarray(ids)
    k = ids.shape[1]
    flat = ids.reshape(-1)
    S = flat.size
    nbm = nb_max(S, n_expert, bm)
    cnt = np.bincount(flat, minlength=n_expert)
    nblk = -(-cnt // bm)
    start_blk = np.concatenate([[0], np.cumsum(nblk)[:-1]])
    blk_expert = np.full(nbm, -1, np.int32)
    for e in np.nonzero(cnt)[0]:
        blk_expert[start_blk[e]:start_blk[e] + nblk[e]] = e
    order = np.argsort(flat, kind="stable")            # slots grouped by expert, in slot order
    rank_in = np.empty(S, np.int64)
    rank_in[order] = np.arange(S) - np.concatenate([[0], np.cumsum(cnt)[:-1]])[flat[order]]
    pos = (start_blk[flat] * bm + rank_in).astype(np.int32)
    blk_rows = np.full(nbm * bm, -1, np.int32)
    blk_rows[pos] = np.arange(S) // k
    used = np.nonzero(cnt)[0]
    used_list = np.full(n_expert, -1, np.int32)
    used_list[:used.size] = used
    rank = np.full(n_expert, -1, np.int32)
    rank[used] = np.arange(used.size)
    return dict(blk_expert=blk_expert, blk_rows=blk_rows, pos=pos, used_list=used_list, rank=rank,
                n_blocks=int(nblk.sum()), n_used=int(used.size))


def combine_ref(y, pos, w):
    """out[t] = sum_j w[t, j] * y[pos[t*k + j]], j in slot order, as moe_combine."""
    T, k = w.shape
    out = np.zeros((T, y.shape[1]), np.float32)
    for j in range(k):
        out += w[:, j:j + 1] * y[np.asarray(pos).reshape(T, k)[:, j]]
    return out


# ---------------------------------------------------------------- launchers (current CuPy stream)
NULL = np.uint64(0)        # a null pointer argument


def _p(a):
    return NULL if a is None else a


def _i32(v):
    return np.int32(v)


def logits(h, w, out, pdl=False):
    """out (T, n_expert) = h (T, n_embd) @ w (n_expert, n_embd).T, all f32 C-contiguous."""
    T, n_embd = h.shape
    n_expert = w.shape[0]
    pdl_call(fn("moe_logits", pdl), (-(-T * n_expert // 4),), (128,),
             (h, w, out, _i32(T), _i32(n_embd), _i32(n_expert)), pdl=pdl)


def topk(lg, k, normalize, ids, wts, pdl=False):
    T, n_expert = lg.shape
    if n_expert > MAX_EXPERTS or k > n_expert:
        raise ValueError(f"moe_topk: {n_expert} experts, top {k} (at most {MAX_EXPERTS} experts)")
    pdl_call(topk_fn(n_expert, pdl), (-(-T // 4),), (128,),
             (lg, ids, wts, _i32(T), _i32(n_expert), _i32(k), _i32(bool(normalize))), pdl=pdl)


def align(ids, n_expert, bm, out, pdl=False):
    """moe_align over (T, k) int32 ids into out's arrays (see align_ref for their shapes)."""
    T, k = ids.shape
    if n_expert > MAX_EXPERTS:
        raise ValueError(f"moe_align: {n_expert} experts (at most {MAX_EXPERTS})")
    nbm = out["blk_expert"].size
    fn("moe_align", pdl)((1,), (ALIGN_THREADS,), (ids, _i32(T * k), _i32(k), _i32(n_expert), _i32(bm), _i32(nbm),
                    out["blk_expert"], out["blk_rows"], out["pos"], out["used_list"], out["rank"], out["meta"]))


def grouped_mv(qtype, n, w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows, kdiv, S, n_blocks, rows, cols,
               x_by_row=False, int8=False, pdl=False):
    """Fused products over blocks of n rows (n=1, blk_rows None: block b = token-slot pair b).
    w1/out1 given: a second matrix of the same shape (up beside gate) in the same launch.
    x_by_row False: x is (T, cols), row i reads its token's row (gate, up); True: x is already in
    padded-row order (P, cols) and row i reads row i (down, on the activations).
    n = 1 takes kernels/moe_mvw.py's moe_mvw (same contract; int8: over x quantized to int8, pdl:
    launched with programmatic dependencies); sorted blocks are plain launches on float x."""
    from lite.kernels import moe_mvw as mvw
    if n == 1:
        return mvw.launch(qtype, w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows, kdiv, S, n_blocks,
                          rows, cols, x_by_row, int8=int8, pdl=pdl)
    if n != MV_N:
        raise ValueError(f"grouped_mv: blocks of {n} token rows (1: pairs, {MV_N}: sorted blocks)")
    grid = (-(-rows // MV_ROWS), n_blocks, 2 if w1 is not None else 1)
    mv_kernel(qtype)(grid, (128,), (w0, _p(w1), np.int64(ebytes), _p(slot_of), x, out0, _p(out1),
                                       blk_expert, _p(blk_rows), _i32(kdiv), _i32(S), _i32(rows), _i32(cols),
                                       _i32(bool(x_by_row))))


def gather_dequant(kern_tile, src, ebytes, eelems, sel, slot_of, out16, n_sel):
    """Dequantize experts sel[0..n_sel) (entries -1: skipped) into out16 (n_sel, eelems) fp16."""
    kern, tile = kern_tile
    kern((-(-eelems // tile), n_sel), (256,), (src, np.int64(ebytes), out16, np.int64(eelems), sel, _p(slot_of)))


def gather_x16(x, blk_rows, xs16, pdl=False):
    fn("moe_gather_x16", pdl)((xs16.shape[0],), (128,), (x, blk_rows, xs16, _i32(x.shape[1])))


def act(g, u, out, kind, pdl=False):
    n = g.size
    name = "moe_act_f16" if out.dtype == np.float16 else "moe_act_f32"
    fn(name, pdl)((min(-(-n // 256), 65535),), (256,), (g, u, out, np.int64(n), _i32(kind == "gelu_tanh")))


def ptrs(blk_expert, rank, slot_of, nbm, wg, wu, wd, w_bytes, xs, xs_bytes, g, u, gu_bytes, h16, h_bytes,
         y, y_bytes, dummy, arrays, pdl=False):
    """Fill arrays (9, nbm) uint64: rows 0-1 A, 2-3 B, 4-5 C of gate|up; 6, 7, 8 A, B, C of down."""
    u64 = np.uint64
    pa, pb, pc = (arrays[i:i + 2].reshape(-1) for i in (0, 2, 4))
    fn("moe_ptrs", pdl)((-(-nbm // 128),), (128,), (blk_expert, _p(rank), _p(slot_of), _i32(nbm), u64(wg), u64(wu),
                   u64(wd), np.int64(w_bytes), u64(xs), np.int64(xs_bytes), u64(g), u64(u), np.int64(gu_bytes),
                   u64(h16), np.int64(h_bytes), u64(y), np.int64(y_bytes), u64(dummy), pa, pb, pc,
                   arrays[6], arrays[7], arrays[8]))


@functools.lru_cache(maxsize=None)
def _cublas_lib():
    """cuBLAS as CuPy loaded it, through ctypes: CuPy's cublas module has no gemmBatchedEx binding
    (cupy-cuda13x 13.x; AttributeError on the H200), so the batched GEMM is called directly, on the
    same library and handle CuPy uses. The path comes from the process's mapped libraries."""
    import ctypes
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/libcublas.so" in line}
    for name in sorted(paths) + ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        fn_ = lib.cublasGemmBatchedEx
        fn_.restype = ctypes.c_int
        fn_.argtypes = ([ctypes.c_void_p] + [ctypes.c_int] * 5 + [ctypes.c_void_p] * 2 + [ctypes.c_int] * 2
                        + [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int])
        return fn_
    raise RuntimeError("cuBLAS (libcublas.so) not found in the process")


CUDA_R_32F, CUDA_R_16F = 0, 2     # cudaDataType (library_types.h)
_ONE, _ZERO = np.array(1.0, np.float32), np.array(0.0, np.float32)


def gemm_batched_f16(handle, m, n, k, a_ptrs, lda, b_ptrs, ldb, c_ptrs, ldc, batch):
    """cublasGemmBatchedEx, column-major C = A^T B per batch entry: A, B fp16, C fp32, fp32
    accumulation; the pointer arrays are device uint64 arrays (a row-major Y = X W^T per block)."""
    from cupy_backends.cuda.libs import cublas
    if batch == 0:
        return
    st = _cublas_lib()(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, m, n, k, _ONE.ctypes.data, a_ptrs,
                       CUDA_R_16F, lda, b_ptrs, CUDA_R_16F, ldb, _ZERO.ctypes.data, c_ptrs, CUDA_R_32F, ldc,
                       batch, cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)
    if st != 0:
        raise RuntimeError(f"cublasGemmBatchedEx failed with status {st}")


def combine(y, pos, w, out, res=None, pdl=False):
    """out (T, n_embd) = sum over j of w[t, j] * y[pos[t * k + j]], plus res (T, n_embd) if given."""
    T, k = w.shape
    pdl_call(fn("moe_combine", pdl), (-(-out.shape[1] // 256), T), (256,),
             (y, _p(pos), w, out, _i32(k), _i32(out.shape[1]), _p(res)), pdl=pdl)
