"""The grouped Mixture-of-Experts layer's kernels besides the expert products (those are
kernels/moe_products.py): CUDA C in kernels/cuda/moe_layer.cu, with NumPy twins of their index logic.

A layer's MoE work is a constant number of launches whatever the number of experts (docs/design.md,
"Experts"); nothing here synchronizes the host, so a decode step stays capturable in a CUDA graph.
  moe_logits   router logits for a few tokens (a warp a dot product; cuBLAS does large T)
  moe_topk     softmax over the experts, top-k (ties: lower index first, as np.argsort stable on -p),
               renormalize: a warp a token -> ids (T, k) int32, weights (T, k) f32
  moe_align    the expert sort, one CTA: counts per expert, each expert's rows padded to a multiple
               of `bm` (a "block" of bm slots, all one expert), the stable position of every
               token-slot in that padded order (pos), the token of every padded row (blk_rows, -1 =
               padding) and the expert of every block (blk_expert, -1 = unused). Deterministic: ranks
               come from warp match masks and per-warp counts, never from atomics' order.
  moe_combine  the weighted sum of each token's k expert outputs, gathered, not scattered with
               atomics (plus the residual where asked)
The batched-GEMM path (prefill chunks): the used experts dequantized to fp16 in one launch a tensor
(gather_dequant: kernels/dequant_common.py's tiled kernel with a second grid dimension),
moe_gather_rows_f16 (rows to fp16 in padded order), moe_act_f32/f16 (the activation),
moe_gemm_pointers (device pointer arrays for cublasGemmBatchedEx).
The twins (route_ref, align_ref, combine_ref) define what the kernels must produce; CI checks them
against the CPU backend, GPU tests check the kernels against them.
"""
import ctypes
import functools

import numpy as np

from lite.kernels import dequant_common, dequant_iq
from lite.kernels.cuda_source import source
from lite.kernels.pdl import call as pdl_call, source_head

C_MOE = source("moe_layer.cu")
MAX_EXPERTS = 512          # moe_align's shared arrays and moe_topk's registers are sized for this
ALIGN_THREADS = 512

# The tiled dequantize's signature and the gathered variant's (y = blockIdx.y picks sel[y]): the
# gathered kernel is the tiled one with this prologue (gather_dequant_source).
_DEQ_SIG = "const uchar* __restrict__ src, long long nbytes, OUT_T* __restrict__ out, long long n) {"
_DEQ_GATHER_SIG = ("const uchar* __restrict__ src0, long long nbytes, OUT_T* __restrict__ out0, long long n,\n"
                   "        const int* __restrict__ sel, const int* __restrict__ slot_of) {\n"
                   "    const int e_ = sel[blockIdx.y];\n"
                   "    const int s_ = e_ < 0 ? -1 : (slot_of ? slot_of[e_] : e_);\n"
                   "    if (s_ < 0) return;\n"
                   "    const uchar* src = src0 + (long long)s_ * nbytes;\n"
                   "    OUT_T* out = out0 + (long long)blockIdx.y * n;")


def gather_dequant_source(qtype):
    """CUDA C of the gathered dequantize for a type the tiled scheme serves, or None (then the
    caller dequantizes the whole 3-D tensor with kernels.dequantize: one launch all the same)."""
    tiled = dequant_common                   # the tiled dequantize scheme's kernels
    k = tiled.KERNELS.get(qtype)
    if k is None:
        return None
    src = tiled.c_source(k.name, k.tb, k.be, k.c_decode)
    for out_t in ("unsigned short", "float"):
        sig = _DEQ_SIG.replace("OUT_T", out_t)
        if sig not in src:      # the tiled kernel changed: say so rather than dequantize whole tensors
            raise RuntimeError(f"gather_dequant_source: the tiled {qtype} kernel has no `{sig}`")
        src = src.replace(sig, _DEQ_GATHER_SIG.replace("OUT_T", out_t))
    return src


# ---------------------------------------------------------------- compiled modules (per device)
@functools.lru_cache(maxsize=None)
def _moe_module(device, head=""):
    import cupy
    names = [f"moe_topk<{v}>" for v in (1, 2, 4, 8, 16)]
    return cupy.RawModule(code=head + C_MOE, options=("--std=c++17",), name_expressions=names)


@functools.lru_cache(maxsize=None)
def _gather_dequant_kernel(device, qtype):
    import cupy
    src = gather_dequant_source(qtype)
    if src is None:
        return None
    mod = cupy.RawModule(code=src, options=("--std=c++17", "--ftz=false", "--fmad=false"))
    k = dequant_common.KERNELS[qtype]
    return mod.get_function(f"deq_{k.name.lower()}_f16"), k.tile_elems()


def _dev():
    import cupy
    return cupy.cuda.runtime.getDevice()


def kernel(name, pdl=False):
    """A kernel of moe_layer.cu; pdl: from the module compiled with LT_PDL (a separate one)."""
    return _moe_module(_dev(), source_head(pdl)).get_function(name)


def topk_kernel(n_expert, pdl=False):
    v = next(v for v in (1, 2, 4, 8, 16) if 32 * v >= n_expert)
    return kernel(f"moe_topk<{v}>", pdl)


def gather_dequant_kernel(qtype, reference=False):
    """(kernel, tile_elems) or None when the type has no CUDA C dequantize to gather with (the tiled
    scheme's types, and IQ3_XXS's own kernel: kernels/dequant_iq.py iq3_gather_kernel; reference: IQ3_XXS
    through the Numba dequantize instead, as its other products)."""
    if qtype == "IQ3_XXS":
        return None if reference else dequant_iq.iq3_gather_kernel(_dev())
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


def max_blocks(S, n_expert, bm):
    """Blocks moe_align may fill: sum over experts of ceil(count / bm) <= ceil(S / bm) + used."""
    return -(-S // bm) + min(n_expert, S)


def align_ref(ids, n_expert, bm):
    """What moe_align computes, from (T, k) ids: dict of blk_expert (max_blocks,), blk_rows
    (max_blocks*bm,), pos (S,), used_list (n_expert,), rank (n_expert,), n_blocks, n_used."""
    ids = np.asarray(ids)
    k = ids.shape[1]
    flat = ids.reshape(-1)
    S = flat.size
    nbm = max_blocks(S, n_expert, bm)
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
    pdl_call(kernel("moe_logits", pdl), (-(-T * n_expert // 4),), (128,),
             (h, w, out, _i32(T), _i32(n_embd), _i32(n_expert)), pdl=pdl)


def topk(lg, k, normalize, ids, wts, pdl=False):
    T, n_expert = lg.shape
    if n_expert > MAX_EXPERTS or k > n_expert:
        raise ValueError(f"moe_topk: {n_expert} experts, top {k} (at most {MAX_EXPERTS} experts)")
    pdl_call(topk_kernel(n_expert, pdl), (-(-T // 4),), (128,),
             (lg, ids, wts, _i32(T), _i32(n_expert), _i32(k), _i32(bool(normalize))), pdl=pdl)


def align(ids, n_expert, bm, out, pdl=False):
    """moe_align over (T, k) int32 ids into out's arrays (see align_ref for their shapes)."""
    T, k = ids.shape
    if n_expert > MAX_EXPERTS:
        raise ValueError(f"moe_align: {n_expert} experts (at most {MAX_EXPERTS})")
    nbm = out["blk_expert"].size
    kernel("moe_align", pdl)((1,), (ALIGN_THREADS,), (ids, _i32(T * k), _i32(k), _i32(n_expert), _i32(bm), _i32(nbm),
                    out["blk_expert"], out["blk_rows"], out["pos"], out["used_list"], out["rank"], out["meta"]))


def gather_dequant(kern_tile, src, ebytes, eelems, sel, slot_of, out16, n_sel):
    """Dequantize experts sel[0..n_sel) (entries -1: skipped) into out16 (n_sel, eelems) fp16."""
    kern, tile = kern_tile
    kern((-(-eelems // tile), n_sel), (256,), (src, np.int64(ebytes), out16, np.int64(eelems), sel, _p(slot_of)))


def gather_rows_f16(x, blk_rows, xs16, pdl=False):
    kernel("moe_gather_rows_f16", pdl)((xs16.shape[0],), (128,), (x, blk_rows, xs16, _i32(x.shape[1])))


def act(g, u, out, kind, pdl=False):
    n = g.size
    name = "moe_act_f16" if out.dtype == np.float16 else "moe_act_f32"
    kernel(name, pdl)((min(-(-n // 256), 65535),), (256,), (g, u, out, np.int64(n), _i32(kind == "gelu_tanh")))


def gemm_pointers(blk_expert, rank, slot_of, nbm, wg, wu, wd, w_bytes, xs, xs_bytes, g, u, gu_bytes, h16, h_bytes,
         y, y_bytes, dummy, arrays, pdl=False):
    """Fill arrays (9, nbm) uint64: rows 0-1 A, 2-3 B, 4-5 C of gate|up; 6, 7, 8 A, B, C of down."""
    u64 = np.uint64
    pa, pb, pc = (arrays[i:i + 2].reshape(-1) for i in (0, 2, 4))
    kernel("moe_gemm_pointers", pdl)((-(-nbm // 128),), (128,), (
        blk_expert, _p(rank), _p(slot_of), _i32(nbm), u64(wg), u64(wu), u64(wd), np.int64(w_bytes), u64(xs),
        np.int64(xs_bytes), u64(g), u64(u), np.int64(gu_bytes), u64(h16), np.int64(h_bytes), u64(y),
        np.int64(y_bytes), u64(dummy), pa, pb, pc, arrays[6], arrays[7], arrays[8]))


@functools.lru_cache(maxsize=None)
def _cublas_lib():
    """cuBLAS as CuPy loaded it, through ctypes: CuPy's cublas module has no gemmBatchedEx binding
    (cupy-cuda13x 13.x raises AttributeError), so the batched GEMM is called directly, on the
    same library and handle CuPy uses. The path comes from the process's mapped libraries."""
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
    pdl_call(kernel("moe_combine", pdl), (-(-out.shape[1] // 256), T), (256,),
             (y, _p(pos), w, out, _i32(k), _i32(out.shape[1]), _p(res)), pdl=pdl)
