"""The expert products of the grouped MoE path: fused dequantize-and-dot over (token, expert) work,
one launch a product whatever the number of experts, no host sync (docs/design.md "Experts").

  moe_decode_product<T, L, C, R, A>  (kernels/cuda/moe_decode_product.cuh) decode, T <= 8 tokens:
      block y is token-slot pair b (its expert blk_expert[b], its token b / k). A CTA's 128 threads
      are groups of L lanes (8, 16 or 32); a group takes R consecutive rows, its lanes the rows'
      32-weight chunks, C chunks a lane a pass, and issues all R * C weight loads of a pass before
      decoding any; the R sums are reduced once at the end by xor-shuffles inside the group (no
      shared memory, no barrier). A: 0 plain; 1 silu, 2 gelu_tanh (gated): the R rows are R/2
      units of gate and the same units of up, and the group writes act(gate) * up, so gate, up and
      the activation are one launch. Why lane groups: a small MoE's expert row has 24-64 chunks, and
      a thread a chunk would leave most of a CTA idle.
  moe_sorted_product<T, N, R>  (kernels/cuda/moe_sorted_product.cuh) short prefill: blocks of
      N = 8 token rows of one expert (moe_align's sort), a CTA R rows of the block's expert, a
      thread a chunk, a shared-memory reduction.
Both take slot_of (expert -> cache slot, -1: not resident this round, its rows untouched),
blockIdx.z for gate or up (both in one launch) and x_by_row for the down product (x one row a
token-slot). Every row is computed on its own in an order fixed by the shape, so experts read from
cache slots give the bytes of resident ones. The per-type decode structs are kernels/matvec_cuda.py's;
IQ3_XXS takes matvec_iq's Iq3XxsBlock, IQ4_XS kernels/cuda/moe_iq4_xs.cuh's Iq4XsBlock; int8: the
decode product over x quantized by kernels/matvec_q8.py, on its integer structs.
"""
import functools
from collections import namedtuple

import numpy as np

from lite.kernels import dequant_iq, iq_tables, matvec_cuda, matvec_iq, matvec_q8
from lite.kernels.cuda_source import source
from lite.kernels.pdl import C_PDL, call as pdl_call, source_head

C_SORTED = source("moe_sorted_product.cuh")
C_IQ4_XS = source("moe_iq4_xs.cuh")
C_DECODE = source("moe_decode_product.cuh")

IQ_STRUCTS = {"IQ3_XXS": "Iq3XxsBlock", "IQ4_XS": "Iq4XsBlock"}   # iq3_xxs_struct.cuh's, moe_iq4_xs.cuh's
IQ_TYPES = tuple(IQ_STRUCTS)
TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K") + IQ_TYPES   # those of kernels/matvec_cuda.py, IQ
THREADS = 128
SORTED_BLOCK = 8           # token rows a sorted block
SORTED_ROWS = 2            # rows a CTA of the sorted product: N=8 with 4 rows spills (ptxas -v, sm_90)
# The IQ3_XXS grid's shared-memory copies a CTA fills (matvec_iq's GCOPIES): none, the grid read
# through L1, which beat 8 copies (BENCHMARKS.md).
IQ3_GRID_COPIES = 0
# Byte alignment the structs' loads need of an expert's blocks (base and expert stride):
# IQ3_XXS blocks (98 bytes) are read in 16-bit halves, IQ4_XS (136) in 8-byte pairs of words.
_IQ_ALIGN = {"IQ3_XXS": 2, "IQ4_XS": 8}
# Raw structs a lane of the decode product may hold at once (R * C), by the size of the type's Raw
# in registers: 8 for the small ones (Q4_K 8 words, Q4_0 6, IQ3_XXS 4, IQ4_XS 6), 4 for the large
# (Q8_0 10, Q5_K 12, Q6_K 14), so that every instance stays under 128 registers without spills.
_RAWS = {"Q4_0": 8, "Q4_K": 8, "IQ3_XXS": 8, "IQ4_XS": 8, "Q8_0": 4, "Q5_K": 4, "Q6_K": 4}
ACTS = {"silu": 1, "gelu_tanh": 2}   # moe_decode_product's A

# moe_decode_product's L, C, R: lanes a row, chunks a lane a pass, rows a lane group.
DecodeShape = namedtuple("DecodeShape", "lanes chunks rows")


def align_bytes(qtype):
    return _IQ_ALIGN[qtype] if qtype in _IQ_ALIGN else matvec_cuda.ALIGN[qtype]


def fits(qtype, base_ptr, ebytes):
    """Can the products read experts of `qtype` at base_ptr, ebytes apart (their loads' alignment)?"""
    a = align_bytes(qtype) if qtype in TYPES else 0
    return a > 0 and base_ptr % a == 0 and ebytes % a == 0


def struct(qtype):
    """The float decode struct of a type: matvec_cuda's (decode_struct), or the IQ types' own."""
    return IQ_STRUCTS[qtype] if qtype in IQ_TYPES else matvec_cuda.decode_struct(qtype)


def sorted_source(qtype="Q4_K", host=False):
    """CUDA C holding the struct of `qtype` and moe_sorted_product. host: without the device-only
    helpers (inline PTX), for the emulator tests, which put host stand-ins first."""
    if qtype not in IQ_TYPES:
        return matvec_cuda.C_HEAD + matvec_cuda.C_TYPES + C_SORTED
    kv = ", ".join(str(int(v)) for v in iq_tables.KVALUES_IQ4)
    # The grid and the levels are compiled into the module (as matvec_iq.c_source does), so each
    # device gets its own copy with the module: no table argument. C_IQ3_XXS brings the macros
    # Iq3XxsBlock uses (GCOPIES, GB, SX); C_COMMON's `#define R 4` is undone before the products' R.
    return ((("" if host else dequant_iq.C_HELPERS) + dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS")
             + f"__device__ const int IQ4_KVALUES[16] = {{{kv}}};\n" + matvec_cuda.C_HEAD
             + matvec_iq.C_COMMON + matvec_iq.C_IQ3_XXS + "#undef R\n" + matvec_iq.C_IQ3_XXS_STAGED
             + C_IQ4_XS + C_SORTED))


def sorted_name(qtype):
    return f"moe_sorted_product<{struct(qtype)}, {SORTED_BLOCK}, {SORTED_ROWS}>"


def decode_shape(qtype, cols):
    """The plain decode product's shape for rows of `cols` weights. lanes: the smallest of 8/16/32
    whose pass of 4 chunks a lane covers the row (else 32, several passes); chunks: what a lane
    needs for one pass (<= 4, <= the Raw budget); rows: the rest of the budget."""
    chunks = cols // 32                  # every type's chunk is 32 weights
    budget = _RAWS[qtype]
    L = next((n for n in (8, 16) if n * 4 >= chunks), 32)
    C = max(1, min(4, budget, -(-chunks // L)))
    R = max(1, min(4, budget // C))
    return DecodeShape(L, C, R)


def gated_shape(qtype, cols):
    """decode_shape() for the gated form: rows even (gate and up rows of rows/2 units), chunks x
    rows within the same budget; with a budget of 8 Raws, 4 rows (2 units a group) and half the
    chunks: twice the units a CTA, which was faster on 30B-A3B's 2048-input gate/up (BENCHMARKS.md)."""
    L, C, R = decode_shape(qtype, cols)
    if _RAWS[qtype] >= 8 and C % 2 == 0 and R == 2:
        return DecodeShape(L, C // 2, 4)
    return DecodeShape(L, C, R) if R % 2 == 0 else DecodeShape(L, max(1, C // 2), 2)


def decode_rows_per_cta(qtype, cols, act=None):
    """Output rows a CTA of the decode product: rows of the matrix, or with act (gated) units."""
    L, _, R = gated_shape(qtype, cols) if act else decode_shape(qtype, cols)
    return THREADS // L * (R // 2 if act else R)


def decode_name(qtype, cols, act=None, int8=False):
    """The decode product's instance; int8: over matvec_q8's quantized x (its integer struct)."""
    shape = gated_shape(qtype, cols) if act else decode_shape(qtype, cols)
    s = matvec_q8.struct(qtype) if int8 else struct(qtype)
    return (f"moe_decode_product<{s}, {shape.lanes}, {shape.chunks}, {shape.rows}"
            + (f", {ACTS[act]}>" if act else ">"))


def decode_source(qtype="Q4_K", host=False, int8=False):
    """The decode product's module: the type structs (with the sorted product), matvec_q8's
    integer structs where int8, then moe_decode_product."""
    return (C_PDL + sorted_source(qtype, host=host) + (matvec_q8.structs(qtype, tables=True) if int8 else "")
            + C_DECODE)


# ---------------------------------------------------------------- compiled kernels (per device)
def _dev():
    import cupy
    return cupy.cuda.runtime.getDevice()


@functools.lru_cache(maxsize=None)
def _sorted_kernel(device, qtype, name):
    import cupy
    mod = cupy.RawModule(code=sorted_source(qtype), options=("--std=c++17",), name_expressions=[name])
    return mod.get_function(name)


@functools.lru_cache(maxsize=None)
def _decode_kernel(device, qtype, kname, head=""):
    import cupy
    mod = cupy.RawModule(code=head + decode_source(qtype, int8=matvec_q8.in_name(kname)),
                         options=("--std=c++17",), name_expressions=[kname])
    return mod.get_function(kname)


def sorted_kernel(qtype):
    return _sorted_kernel(_dev(), qtype, sorted_name(qtype))


def decode_kernel(qtype, cols, act=None, int8=False, pdl=False):
    """pdl: the module compiled with LT_PDL (a separate one)."""
    head = source_head(pdl) + f"#define GCOPIES {IQ3_GRID_COPIES}\n"
    return _decode_kernel(_dev(), qtype, decode_name(qtype, cols, act, int8), head)


# ---------------------------------------------------------------- launchers (current CuPy stream)
NULL = np.uint64(0)        # a null pointer argument


def _p(a):
    return NULL if a is None else a


def _args(w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows, kdiv, S, rows, cols, x_by_row):
    i32 = np.int32
    return (w0, _p(w1), np.int64(ebytes), _p(slot_of), x, out0, _p(out1), blk_expert, _p(blk_rows),
            i32(kdiv), i32(S), i32(rows), i32(cols), i32(bool(x_by_row)))


def grouped(qtype, n, w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows, kdiv, S, n_blocks, rows, cols,
            x_by_row=False, int8=False, pdl=False):
    """The products over blocks of n token rows: n = 1, blk_rows None: block b = token-slot pair b
    (decode()); n = SORTED_BLOCK: moe_align's sorted blocks (plain launches on float x). w1/out1
    given: a second matrix of the same shape (up beside gate) in the same launch. x_by_row False: x
    is (T, cols), row i reads its token's row (gate, up); True: x is already in padded-row order
    (P, cols) and row i reads row i (down, on the activations)."""
    if n == 1:
        return decode(qtype, w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows, kdiv, S, n_blocks,
                      rows, cols, x_by_row, int8=int8, pdl=pdl)
    if n != SORTED_BLOCK:
        raise ValueError(f"moe products: blocks of {n} token rows (1: pairs, {SORTED_BLOCK}: sorted blocks)")
    grid = (-(-rows // SORTED_ROWS), n_blocks, 2 if w1 is not None else 1)
    sorted_kernel(qtype)(grid, (THREADS,), _args(w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows,
                                                 kdiv, S, rows, cols, x_by_row))


def decode_grid(qtype, rows, cols, n_blocks, two, act=None):
    return (-(-rows // decode_rows_per_cta(qtype, cols, act)), n_blocks, 2 if two and not act else 1)


def decode(qtype, w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows, kdiv, S, n_blocks, rows, cols,
           x_by_row=False, act=None, int8=False, pdl=False):
    """The decode product (grouped()'s arguments for n = 1). act ("silu" / "gelu_tanh"): out0
    (slots, rows) = act(w0 x) * (w1 x), out1 unused. int8: x's rows quantized (matvec_q8) for the
    type's integer struct. pdl: launched with programmatic dependencies."""
    if act and (w1 is None or x_by_row):
        raise ValueError("the gated decode product takes gate (w0) and up (w1) of the token's x")
    if int8:
        x = matvec_q8.quantize(qtype, x, pdl=pdl)
    pdl_call(decode_kernel(qtype, cols, act, int8, pdl), decode_grid(qtype, rows, cols, n_blocks, w1 is not None, act),
             (THREADS,), _args(w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows, kdiv, S, rows, cols,
                               x_by_row), pdl=pdl)
