"""`moe_mvw`: a decode variant of the grouped MoE matvec `moe_mv` for small expert matrices (issue 6).

The default for decode products since session 3 (LITE_MOE_MV=cta: the old moe_mv). On the H200
(scripts/moe_decode_ab.sh Q4_K, synthetic Qwen3-30B-A3B, all experts on the GPU): tg64 after 2048
tokens 218.6 tok/s against moe_mv's 204.6 (+6.9%); tests/test_experts_mvw.py (this kernel = moe_mv
within fp32 rounding, a layer = the CPU backend) passed there. Also run on the host by
tests/cuda_c_emulator.py against float64 (tests/test_moe_mvw_emulated.py).

Why. moe_mv gives a (token, expert) block's R rows to a CTA of 128 threads, a thread per 32-weight
chunk of a row. A Qwen3-30B-A3B expert row has 64 chunks (gate/up, 2048 inputs) or 24 (down, 768):
64 or 104 of the 128 threads hold no chunk, and the block ends with a shared-memory reduction and a
__syncthreads. Here a CTA's 128 threads are split into groups of L lanes (L = 8, 16 or 32, so 4-16
groups a CTA); a group takes R consecutive rows and its lanes the row's chunks, C chunks a lane per
pass (lane j of the group: chunks j, j + L, ..., so a group's 16-byte loads of one pass are
contiguous). A lane first issues all R * C weight loads of a pass (16-byte loads where the struct
has them), then decodes and accumulates R sums; the R sums are reduced once at the end by
log2(L) xor-shuffles inside the group (no shared memory, no barrier), and lanes 0..R-1 of the group
write the R rows. L, C, R are chosen from the row's chunk count so that one pass covers the row
when it can (30B-A3B Q4_K: down L=8, C=3, R=2: 32 rows a CTA; gate/up in the gated form L=16, C=2, R=4:
16 units of gate and up a CTA, gated_config).

Launch contract: that of moe_mv with N = 1 (the pairs path): block y = token-slot pair b, its expert
blk_expert[b] (-1: nothing), slot_of (expert -> cache slot, -1: not this round, rows untouched),
blockIdx.z picks gate or up (both in one launch), x_by_row for the down product, the per-type
decode structs of kernels/matvec_cuda.py (and the IQ ones moe_mv takes). Rows are computed each on
their own, in an order fixed by (L, C, R), so streamed and resident experts stay byte-identical.
"""
import functools

import numpy as np

from lite.kernels import matvec_q8
from lite.kernels.cuda_source import source
from lite.kernels.pdl import C_PDL, call as pdl_call, source_head

# The IQ3_XXS grid's shared-memory copies a CTA fills (matvec_iq's GCOPIES): none, the grid read
# through L1 (it beat 8 copies on the H200, BENCHMARKS.md).
IQ3_GRID_COPIES = 0

C_MVW = source("moe_decode_product.cuh")

# Raw structs a lane may hold at once (R * C), by the size of the type's Raw (registers): 8 for the
# small ones (Q4_K 8 words, Q4_0 6, IQ3_XXS 4, IQ4_XS 6), 4 for the large (Q8_0 10, Q5_K 12, Q6_K 14).
# Chosen so the instances stay under ~128 registers without spills (nvcc sm_90, docs/experts.md);
# not tuned on a GPU.
_RAWS = {"Q4_0": 8, "Q4_K": 8, "IQ3_XXS": 8, "IQ4_XS": 8, "Q8_0": 4, "Q5_K": 4, "Q6_K": 4}
THREADS = 128


def config(qtype, cols):
    """(L, C, R): lanes a row, chunks a lane a pass, rows a lane group. L: the smallest of 8/16/32
    whose pass of 4 chunks a lane covers the row (else 32, several passes); C: the chunks a lane
    needs for one pass (<= 4, <= the Raw budget); R: the rest of the budget in rows."""
    chunks = cols // 32                  # every type's chunk is 32 weights
    budget = _RAWS[qtype]
    L = next((l for l in (8, 16) if l * 4 >= chunks), 32)
    C = max(1, min(4, budget, -(-chunks // L)))
    R = max(1, min(4, budget // C))
    return L, C, R


def gated_config(qtype, cols):
    """config() for the gated form: R even (gate and up rows of R/2 units), C * R within the
    same budget; with a budget of 8 Raws, R = 4 (2 units a group) and C = 2: twice the rows a CTA
    of config()'s (16, 4, 2) at 2048 inputs. H200, session 6, 30B-A3B decode after 2K (BENCHMARKS):
    IQ3_XXS 204.1 / 205.3 -> 251.0 / 248.9 tok/s (with the grid read through L1, matvec_iq.grid_copies()),
    Q4_K 307.5 / 309.7 -> 334.1 / 335.1."""
    L, C, R = config(qtype, cols)
    if _RAWS[qtype] >= 8 and C % 2 == 0 and R == 2:
        return L, C // 2, 4
    return (L, C, R) if R % 2 == 0 else (L, max(1, C // 2), 2)


ACTS = {"silu": 1, "gelu_tanh": 2}


def rows_per_cta(qtype, cols, act=None):
    """Output rows a CTA: rows of the matrix, or with act (gated) units of gate and up."""
    L, _, R = gated_config(qtype, cols) if act else config(qtype, cols)
    return THREADS // L * (R // 2 if act else R)


def name(qtype, cols, act=None, int8=False):
    """The kernel's name; int8: over matvec_q8's quantized x (its integer struct, TQ*_KQ)."""
    from lite.kernels import moe_cuda as mk
    L, C, R = gated_config(qtype, cols) if act else config(qtype, cols)
    struct = matvec_q8.struct(qtype) if int8 else mk.mv_struct(qtype)
    return f"moe_mvw<{struct}, {L}, {C}, {R}" + (f", {ACTS[act]}>" if act else ">")


def source(qtype="Q4_K", host=False, q8=False):
    """moe_mv's module source (the type structs) with moe_mvw after it; q8: with matvec_q8's
    integer structs (only where used)."""
    from lite.kernels import moe_cuda as mk
    return C_PDL + mk.mv_source(qtype, host=host) + (matvec_q8.structs(qtype, tables=True) if q8 else "") + C_MVW


def gated_config(qtype, cols):
    """config() for the gated form: R even (gate and up rows of R/2 units), C * R within the
    same budget; with a budget of 8 Raws, R = 4 (2 units a group) and C = 2: twice the rows a CTA
    of config()'s (16, 4, 2) at 2048 inputs. H200, session 6, 30B-A3B decode after 2K (BENCHMARKS):
    IQ3_XXS 204.1 / 205.3 -> 251.0 / 248.9 tok/s (with the grid read through L1, matvec_iq.grid_copies()),
    Q4_K 307.5 / 309.7 -> 334.1 / 335.1."""
    L, C, R = config(qtype, cols)
    if _RAWS[qtype] >= 8 and C % 2 == 0 and R == 2:
        return L, C // 2, 4
    return (L, C, R) if R % 2 == 0 else (L, max(1, C // 2), 2)


ACTS = {"silu": 1, "gelu_tanh": 2}


def rows_per_cta(qtype, cols, act=None):
    """Output rows a CTA: rows of the matrix, or with act (gated) units of gate and up."""
    L, _, R = gated_config(qtype, cols) if act else config(qtype, cols)
    return THREADS // L * (R // 2 if act else R)


def name(qtype, cols, act=None, int8=False):
    """The kernel's name; int8: over matvec_q8's quantized x (its integer struct, TQ*_KQ)."""
    from lite.kernels import moe_cuda as mk
    L, C, R = gated_config(qtype, cols) if act else config(qtype, cols)
    struct = matvec_q8.struct(qtype) if int8 else mk.mv_struct(qtype)
    return f"moe_mvw<{struct}, {L}, {C}, {R}" + (f", {ACTS[act]}>" if act else ">")


def source(qtype="Q4_K", host=False, q8=False):
    """moe_mv's module source (the type structs) with moe_mvw after it; q8: with matvec_q8's
    integer structs (only where used)."""
    from lite.kernels import moe_cuda as mk
    return C_PDL + mk.mv_source(qtype, host=host) + (matvec_q8.structs(qtype, tables=True) if q8 else "") + C_MVW


def gated_config(qtype, cols):
    """config() for the gated form: R even (gate and up rows of R/2 units), C * R within the
    same budget; with a budget of 8 Raws, R = 4 (2 units a group) and C = 2: twice the rows a CTA
    of config()'s (16, 4, 2) at 2048 inputs. H200, session 6, 30B-A3B decode after 2K (BENCHMARKS):
    IQ3_XXS 204.1 / 205.3 -> 251.0 / 248.9 tok/s (with the grid read through L1, matvec_iq.grid_copies()),
    Q4_K 307.5 / 309.7 -> 334.1 / 335.1."""
    L, C, R = config(qtype, cols)
    if _RAWS[qtype] >= 8 and C % 2 == 0 and R == 2:
        return L, C // 2, 4
    return (L, C, R) if R % 2 == 0 else (L, max(1, C // 2), 2)


ACTS = {"silu": 1, "gelu_tanh": 2}


def rows_per_cta(qtype, cols, act=None):
    """Output rows a CTA: rows of the matrix, or with act (gated) units of gate and up."""
    L, _, R = gated_config(qtype, cols) if act else config(qtype, cols)
    return THREADS // L * (R // 2 if act else R)


def name(qtype, cols, act=None, int8=False):
    """The kernel's name; int8: over matvec_q8's quantized x (its integer struct, TQ*_KQ)."""
    from lite.kernels import moe_cuda as mk
    L, C, R = gated_config(qtype, cols) if act else config(qtype, cols)
    struct = matvec_q8.struct(qtype) if int8 else mk.mv_struct(qtype)
    return f"moe_mvw<{struct}, {L}, {C}, {R}" + (f", {ACTS[act]}>" if act else ">")


def source(qtype="Q4_K", host=False, q8=False):
    """moe_mv's module source (the type structs) with moe_mvw after it; q8: with matvec_q8's
    integer structs (only where used)."""
    from lite.kernels import moe_cuda as mk
    return C_PDL + mk.mv_source(qtype, host=host) + (matvec_q8.structs(qtype, tables=True) if q8 else "") + C_MVW


def gated_config(qtype, cols):
    """config() for the gated form: R even (gate and up rows of R/2 units), C * R within the
    same budget; with a budget of 8 Raws, R = 4 (2 units a group) and C = 2: twice the rows a CTA
    of config()'s (16, 4, 2) at 2048 inputs. H200, session 6, 30B-A3B decode after 2K (BENCHMARKS):
    IQ3_XXS 204.1 / 205.3 -> 251.0 / 248.9 tok/s (with the grid read through L1, matvec_iq.grid_copies()),
    Q4_K 307.5 / 309.7 -> 334.1 / 335.1."""
    L, C, R = config(qtype, cols)
    if _RAWS[qtype] >= 8 and C % 2 == 0 and R == 2:
        return L, C // 2, 4
    return (L, C, R) if R % 2 == 0 else (L, max(1, C // 2), 2)


ACTS = {"silu": 1, "gelu_tanh": 2}


def rows_per_cta(qtype, cols, act=None):
    """Output rows a CTA: rows of the matrix, or with act (gated) units of gate and up."""
    L, _, R = gated_config(qtype, cols) if act else config(qtype, cols)
    return THREADS // L * (R // 2 if act else R)


def name(qtype, cols, act=None, int8=False):
    """The kernel's name; int8: over matvec_q8's quantized x (its integer struct, TQ*_KQ)."""
    from lite.kernels import moe_cuda as mk
    L, C, R = gated_config(qtype, cols) if act else config(qtype, cols)
    struct = matvec_q8.struct(qtype) if int8 else mk.mv_struct(qtype)
    return f"moe_mvw<{struct}, {L}, {C}, {R}" + (f", {ACTS[act]}>" if act else ">")


def source(qtype="Q4_K", host=False, q8=False):
    """moe_mv's module source (the type structs) with moe_mvw after it; q8: with matvec_q8's
    integer structs (only where used)."""
    from lite.kernels import moe_cuda as mk
    return C_PDL + mk.mv_source(qtype, host=host) + (matvec_q8.structs(qtype, tables=True) if q8 else "") + C_MVW


def enabled():
    """Decode products (pairs) take moe_mvw (default); LITE_MOE_MV=cta: moe_mv."""
    return os.environ.get("LITE_MOE_MV", "warp").strip().lower() != "cta"


@functools.lru_cache(maxsize=None)
def _kernel(device, qtype, kname, head=""):
    import cupy
    mod = cupy.RawModule(code=head + source(qtype, q8=matvec_q8.in_name(kname)), options=("--std=c++17",),
                         name_expressions=[kname])
    return mod.get_function(kname)


def kernel(qtype, cols, act=None, int8=False, pdl=False):
    import cupy
    head = source_head(pdl) + f"#define GCOPIES {IQ3_GRID_COPIES}\n"
    return _kernel(cupy.cuda.runtime.getDevice(), qtype, name(qtype, cols, act, int8), head)


def grid(qtype, rows, cols, n_blocks, two, act=None):
    return (-(-rows // rows_per_cta(qtype, cols, act)), n_blocks, 2 if two and not act else 1)


def launch(qtype, w0, w1, ebytes, slot_of, x, out0, out1, blk_expert, blk_rows, kdiv, S, n_blocks, rows, cols,
           x_by_row=False, act=None, int8=False, pdl=False):
    """moe_cuda.grouped_mv's arguments for n = 1 (same meaning), on the current CuPy stream.
    act ("silu" / "gelu_tanh"): out0 (slots, rows) = act(w0 x) * (w1 x), the activation of gate
    and up in the same launch (out1 unused). int8: x's rows quantized (matvec_q8) for the type's
    integer struct. pdl: launched with programmatic dependencies (a module compiled for it)."""
    null, i32 = np.uint64(0), np.int32
    if act and (w1 is None or x_by_row):
        raise ValueError("the gated moe_mvw takes gate (w0) and up (w1) of the token's x")
    if int8:
        x = matvec_q8.quantize(qtype, x, pdl=pdl)
    pdl_call(kernel(qtype, cols, act, int8, pdl), grid(qtype, rows, cols, n_blocks, w1 is not None, act), (THREADS,),
             (w0, null if w1 is None else w1, np.int64(ebytes), null if slot_of is None else slot_of,
              x, out0, null if out1 is None else out1, blk_expert,
              null if blk_rows is None else blk_rows, i32(kdiv), i32(S), i32(rows), i32(cols),
              i32(bool(x_by_row))), pdl=pdl)
