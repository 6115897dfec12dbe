"""Decode matvec on integer dot products: x quantized once per product to int8 in two parts
(`quantize_x`, the x quantizer), then 4 weights a `dp4a` instead of 2 instructions a weight. The default for
the dense decode products of Q4_K, Q6_K and IQ3_XXS and the MoE experts' (BackendConfig's
int8_dot_types and moe_int8_dot; the gains: BENCHMARKS.md). CUDA C: kernels/cuda/int8_*.cuh.

Why: Nsight Compute found the register matvec (kernels/matvec_cuda.py `matvec_rows`) bound by issue and
latency, not DRAM: ~5 instructions a weight for matvec_rows, ~2.5 for the two-instruction dot, 80-95 registers, 4-5 warps a
scheduler. Here a
32-weight chunk of one Q4_K row costs ~50 instructions (16 dp4a, 12 to split nibbles, 4 to
combine, the sub-block scales) against the two-instruction dot's ~80, and x takes 5 registers of 16 bytes a chunk
against 8 float4 plus 2 sums. llama.cpp's mmvq does the same with x in one int8 part (q8_1); one
part alone is ~0.3% off in a product, far outside the 1e-3 the kernels here are held to, so:

x in two int8 parts. Each run of 16 x values (a Q4_K chunk has two: the low nibbles meet x at
64j + l0 + [0, 16), the high ones at 64j + 32 + l0 + [0, 16)) takes a = max |x|,
t = x * 127 / a, hi = rint(t), lo = rint((t - hi) * 254): x = d * (254 hi + lo) with d = a / (127 * 254),
off by at most a / 64,516 (t - hi is exact; both parts lie in [-127, 127]). A row's run then sums
as the exact integer 254 * dp4a(w, hi) + dp4a(w, lo) (|.| < 2^23, so also exact as a float) times d.
The Q4_K minimums (and Q6_K's -32 offset) take the run's sum of the quantized x, so that what
the integer-dot product computes is W times quantized x, up to fp32 rounding.

Layout of quantized x (`quantize_x` writes it, 8 threads a chunk): for chunk c of a row, 80 bytes at byte
80 c: hi of run a, hi of run b, lo of run a, lo of run b (16 int8 each), then float4 (d_a, sum_a, d_b,
sum_b) (Q6_K: 96 bytes, the sums by 8 values); rows of x `cols` floats apart, as x itself. So TQ4_KQ
below is a struct of matvec_cuda's register loop as it stands: its xoff points load_x at the 5
vectors of a record (the loads of 3 more and load_x's sums of x go unused and are dropped by the
compiler), and its dot reads them as integers; matvec_rows<TQ4_KQ, ...> is matvec_rows over quantized x.
"""
import functools

import numpy as np

from lite.kernels import matvec_structs as matvec_cuda   # the shared launch shape, alignment, types
from lite.kernels.cuda_source import includes, source
from lite.kernels import pdl as pdl_mod

C_Q8_BASE = source("int8_x_records.cuh")
C_Q8_K = source("int8_kquant_structs.cuh")

C_Q8 = C_Q8_BASE + C_Q8_K          # the K types' module text (after matvec_cuda's C_HEAD, C_TYPES)

# IQ3_XXS on dp4a over quantized x: the integer struct Iq3XxsBlockInt8X (after matvec_iq's Iq3XxsBlock) and
# iq_tables' offset-binary tables: each grid byte g as 64 + g (IQ3XXS_GRID64), 64 - g where its sign bit is set
# (u - 2 (u & 0x3F mask), iq_tables' sign masks as uint2 pairs: no borrow between bytes), so a word of 4 weights
# meets x in 2 dp4a; the offset 64 comes off once a run of 16 as 64 times the run's sum of quantized
# x. Sums a run: |dp4a sums| <= 16 * 126 * 127 (exact), their 254-weighted total < 2^26 (one fp32
# rounding, ~6e-8 of it, before the offset cancels): inside the x quantization's bound.
# (With its sign-mask table, iq3_sign_masks.cuh: one load a group.)
C_Q8_IQ3 = source("int8_iq3_xxs_structs.cuh")

# Where Iq3XxsBlockInt8X finds its tables (GC, SC, see C_Q8_IQ3): one grid copy in shared memory, the sign
# masks computed (the fastest placement measured, BENCHMARKS.md).
IQ3_TABLES = (1, 2)

# matvec_cuda's `matvec_rows` with the struct's table fill first: the kernel of every IQ3_XXS integer-dot product.
C_MATVEC_WITH_INIT = source("matvec_with_init.cuh")


def iq3_struct_name(tables=None, grouped=False):
    """IQ3_XXS's integer struct's C++ name for (GC, SC) tables (default IQ3_TABLES); grouped: IQ3_XXS_G4's
    (Iq3XxsGroup4Int8X)."""
    gc, sc = IQ3_TABLES if tables is None else tables
    return f"{'Iq3XxsGroup4Int8X' if grouped else 'Iq3XxsBlockInt8X'}<{gc}, {sc}>"


# The record layout of quantized x by record size (LT_Q8_LAYOUT20 / 24, int8_x_records.cuh's defaults):
# layout 1 for Q6_K's 24-word records, 0 for the 20-word ones (Q4_K, IQ3_XXS): the faster of each.
LAYOUTS = {20: 0, 24: 1}

C_MAX_N = matvec_cuda.C_MAX_N      # rows of x a launch (the register loop's N)

# The float struct whose x layout quantize_x quantizes, the integer struct, and quantize_x's words a chunk, per type.
# IQ3_XXS_G4: IQ3_XXS's blocks regrouped by the GPU backend (kernels/iq3_groups.py), the same x.
TYPES = {"Q4_K": ("TQ4_K", "TQ4_KQ", 20), "Q6_K": ("TQ6_K", "TQ6_KQ", 24), "IQ3_XXS": ("Iq3XxsBlock", "Iq3XxsBlockInt8X", 20),
         "IQ3_XXS_G4": ("Iq3XxsBlock", "Iq3XxsGroup4Int8X", 20)}
# (rows a CTA, prefetch) of every integer-dot launch, the decode epilogue kernels' (matvec_epilogue)
# too: the fastest at the decode shapes (BENCHMARKS.md). Few registers (~48), so 2 rows a CTA still
# keep enough warps a scheduler; IQ3_XXS_G4's prefetch 2 spreads a row's last half trip over all
# 128 threads (matvec_cuda's matvec_rows_partials).
CONFIGS = {"Q4_K": (2, 0), "Q6_K": (2, 0) if LAYOUTS[24] else (4, 0), "IQ3_XXS": (4, 0), "IQ3_XXS_G4": (4, 2)}
DEFAULT_TYPES = matvec_cuda.INT8_DOT_TYPES       # the types that can run on dp4a (all by default)


def record_words(chunks, rw, layout=None):
    """(chunks, rw) int array: where word w of chunk c's record lies in a row of quantized x (the
    index of x_record_word in C_Q8_BASE, in 4-byte words)."""
    c, w = np.arange(chunks)[:, None], np.arange(rw)[None, :]
    if (LAYOUTS[rw] if layout is None else layout):
        return (c >> 3) * (8 * rw) + (w >> 2) * 32 + (c & 7) * 4 + (w & 3)
    return rw * c + w


def applies(qtype, int8_dot_types=DEFAULT_TYPES):
    """True when qtype's decode products take the integer-dot kernels: int8_dot_types names it
    (IQ3_XXS_G4: always, its only kernel; the backend makes that layout only where IQ3_XXS's
    applies, kernels/gpu_layout.py)."""
    return qtype in int8_dot_types or qtype == "IQ3_XXS_G4"


def applies_moe(qtype, int8_dot_types=DEFAULT_TYPES, moe_int8_dot=True):
    """The MoE decode experts' products (kernels/moe_products.py) on the same structs over quantized x:
    BackendConfig.moe_int8_dot, for the types int8_dot_types names."""
    return moe_int8_dot and applies(qtype, int8_dot_types)


# Block alignment the integer structs' loads need: the K types' as matvec_cuda.ALIGN; IQ3_XXS's
# 98-byte blocks are read in 16-bit halves, IQ3_XXS_G4's groups (kernels/iq3_groups.py) in 8-byte words.
ALIGN = {"Q4_K": matvec_cuda.ALIGN["Q4_K"], "Q6_K": matvec_cuda.ALIGN["Q6_K"], "IQ3_XXS": 2, "IQ3_XXS_G4": 8}


def qualifies(qtype, blocks, x, int8_dot_types=DEFAULT_TYPES):
    """True when qtype's products take the integer-dot kernels here and these device arrays are aligned for them."""
    return (applies(qtype, int8_dot_types) and matvec_cuda._ptr(blocks) % ALIGN[qtype] == 0
            and matvec_cuda._ptr(x) % 16 == 0)


def config(qtype):
    """(rows a CTA, prefetch) of qtype's integer-dot launches."""
    return CONFIGS[qtype]


def struct(qtype):
    """The integer struct of qtype's kernels (IQ3_XXS: with its table placement, IQ3_TABLES)."""
    if qtype.startswith("IQ3_XXS"):
        return iq3_struct_name(grouped=qtype == "IQ3_XXS_G4")
    return TYPES[qtype][1]


def in_name(kernel_name):
    """True when a kernel's name instantiates one of the integer structs, so its module needs
    structs() (matvec_epilogue's and moe_decode_product's kernel caches build the source from the name)."""
    return any(f"<{s}" in kernel_name for _, s, _ in TYPES.values())   # Iq3XxsBlockInt8X<GC, SC> by its prefix


def c_source(qtype="Q4_K"):
    """The module text of qtype's quantizer and integer-dot kernels. The K types: the x quantizer quantize_x and
    matvec_rows over TQ4_KQ / TQ6_KQ, on matvec_cuda's register loop. IQ3_XXS: the x quantizer and matvec_with_init
    over Iq3XxsBlockInt8X (the file's layout) or Iq3XxsGroup4Int8X (IQ3_XXS_G4); also the base of the tensor-core
    product's module (matvec_mma.c_source) and the epilogue kernels' IQ3_XXS module."""
    if qtype.startswith("IQ3_XXS"):
        return includes("iq_helpers.cuh", "iq3_grid.cuh", "iq3_offset_tables.cuh", "iq4_values.cuh",
                        "matvec_common.cuh", "matvec_register_loop.cuh", "matvec_iq_common.cuh", "matvec_iq3_xxs.cuh",
                        "matvec_iq4_xs.cuh", "iq3_xxs_struct.cuh", "matvec_with_init.cuh", "int8_x_records.cuh",
                        "int8_iq3_xxs_structs.cuh")
    return includes("matvec_common.cuh", "matvec_float_structs.cuh", "matvec_register_loop.cuh", "int8_x_records.cuh",
                    "int8_kquant_structs.cuh")


def structs(qtype, tables=False):
    """The text that adds qtype's integer struct to a module holding its float struct (moe_decode_product's);
    tables: also IQ3_XXS's offset-binary tables (a module without them)."""
    if qtype.startswith("IQ3_XXS"):
        return (source("iq3_offset_tables.cuh") if tables else "") + layout_define() + C_Q8_BASE + C_Q8_IQ3
    return layout_define() + C_Q8


def layout_define():
    """The lines that set quantized x's record layouts (LT_Q8_LAYOUT20 / 24 in C_Q8_BASE) to LAYOUTS."""
    return "".join(f"#define LT_Q8_LAYOUT{rw} {v}\n" for rw, v in LAYOUTS.items())


def quantize_name(qtype):
    return f"quantize_x<{TYPES[qtype][0]}, {TYPES[qtype][2]}>"


def kernel_name(qtype, n, rows=8, prefetch=0, tables=None):
    """matvec_rows over quantized x; IQ3_XXS: matvec_with_init (matvec_rows with the struct's table fill first, C_MATVEC_WITH_INIT).
    tables: IQ3_XXS's (GC, SC) instead of IQ3_TABLES."""
    if qtype.startswith("IQ3_XXS"):
        return f"matvec_with_init<{iq3_struct_name(tables, qtype == 'IQ3_XXS_G4')}, {n}, {rows}, {prefetch}>"
    return f"matvec_rows<{TYPES[qtype][1]}, {n}, {rows}, {prefetch}>"


@functools.lru_cache(maxsize=None)
def _module(device, qtype, names, head=""):
    import cupy
    return cupy.RawModule(code=head + c_source(qtype), options=("--std=c++17",), name_expressions=list(names))


def functions(device, qtype, n, rows=8, prefetch=0, pdl=False):
    """(quantizer, matvec) CuPy kernels of one type, n and CTA shape (pdl: compiled for PDL)."""
    names = (quantize_name(qtype), kernel_name(qtype, n, rows, prefetch))
    mod = _module(device, qtype, names, pdl_mod.source_head(pdl))
    return mod.get_function(names[0]), mod.get_function(names[1])


def quantize_grid(n, cols):
    """quantize_x's grid for n rows of x of cols values: a thread a float4."""
    return ((cols // 4 + 127) // 128, n)


def quantize(qtype, x, pdl=False):
    """xq = quantize_x(x) on CuPy's current stream (a new buffer shaped as x; one launch, PDL like the
    matvecs): what matvec_rows<TQ4_KQ> and matvec_fused_end<TQ4_KQ> read."""
    import cupy
    x = cupy.ascontiguousarray(x)                # rows cols floats apart, as quantize_x reads them
    xq = cupy.empty_like(x)
    _quantize_into(qtype, x, xq, pdl)
    return xq


def _quantize_into(qtype, x, xq, pdl=False):
    """Enqueue quantize_x(x) into xq (x C-contiguous (n, cols)); PDL like the matvecs."""
    import cupy
    # quantize_x does not depend on n (grid y): take the module of n = 1, the decode step's
    quant = functions(cupy.cuda.runtime.getDevice(), qtype, 1, *config(qtype), pdl=pdl)[0]
    pdl_mod.call(quant, quantize_grid(*x.shape), (128,), (x, xq, np.int32(x.shape[1])), pdl=pdl)


def launch(qtype, blocks, x, xq, out, rows, cols, cta=None, pdl=False):
    """Enqueue xq = quantize_x(x), then out = x @ W.T from xq, on CuPy's current stream (two launches, no
    host synchronization; meant to be captured). x (n, cols) float32, xq a float32 buffer of the
    same shape (scratch), out (n, rows) float32; n <= matvec_cuda.C_MAX_N; blocks aligned as
    matvec_cuda.ALIGN. cta: (rows a CTA, prefetch), default config(qtype)."""
    if qtype not in TYPES:
        raise ValueError(f"matvec_q8: no integer-dot kernel for {qtype} (have {', '.join(TYPES)})")
    import cupy
    n, cta = x.shape[0], cta or config(qtype)
    _quantize_into(qtype, x, xq, pdl)
    product = functions(cupy.cuda.runtime.getDevice(), qtype, n, *cta, pdl=pdl)[1]
    pdl_mod.call(product, ((rows + cta[0] - 1) // cta[0],), (matvec_cuda.THREADS,),
                 (blocks, xq, out, np.int32(rows), np.int32(cols)), pdl=pdl)
