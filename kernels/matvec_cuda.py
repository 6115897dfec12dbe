"""Fused dequantize-and-dot (decode matvec) for Q4_0, Q8_0, Q4_K, Q5_K and Q6_K in CUDA C (CuPy RawModule).

out (n, rows) f32 = x (n, cols) f32 @ W.T, W (rows, cols) as GGUF blocks, fp32 accumulation, x in fp32.
This is the GPU path of kernels/matvec_basic.py (which dispatches here on a GPU when the inputs are
aligned); the Numba kernels there stay the CI-checked twin (same products, checked against each other
on the GPU). Why it is shaped this way (the Numba kernels reached 10-24% of copy bandwidth, bound by
instructions, not memory):
  - A CTA of 4 warps owns R rows; its 128 threads split each row into *chunks* of 32 weights (lanes of
    a warp take consecutive chunks, so weight loads coalesce). A thread loads the x of its chunk once
    (8 float4) and reuses it for all R rows: x is 32 bits a weight against 4.5-8.5, so without reuse
    x traffic through L1 would exceed the weight traffic several times over.
  - The R chunk loads of a loop trip are issued together (R independent 16-32 byte loads in flight
    a thread); with prefetch (P=1) the next trip's are issued before this trip's are used. Q4_K/Q5_K blocks (144/176 bytes) are 16-byte aligned
    and read with 16-byte loads; Q4_0 (18), Q8_0 (34) and Q6_K (210) blocks start at 2 mod 4 bytes
    half the time, so they are read as aligned 32-bit words and re-aligned with funnel shifts.
  - A chunk never straddles a sub-block boundary, so its scales decode once per 16-32 weights.
  - Quant bytes become floats by the exponent trick: PRMT places byte b under 0x4B000000 (= 2^23 + b
    exactly) and one FADD removes 2^23 plus the type's zero point (8, 32, 128): exact, 2 instructions,
    avoiding the quarter-rate int->float unit. Q4_K/Q5_K minimums use per-run sums of x.
  - Templated on n (1..C_MAX_N; larger n in chunks) so accumulators stay in registers; per n the
    weights are re-decoded from registers rather than keeping 32 floats of x per n alive.
"""
import contextlib
import functools

import numpy as np

from lite.kernels import pdl as pdl_mod
from lite.kernels.matvec_structs import C_TYPES, FAST_DOT  # noqa: F401  (C_TYPES: other modules read it here)
from lite.kernels.matvec_structs import ALIGN, C_MAX_N, INT8_DOT_TYPES, THREADS, _ptr  # noqa: F401
from lite.kernels.cuda_source import includes, source

# (rows a CTA, prefetch 0/1) per type: the fastest at the decode shapes (BENCHMARKS.md); 16 rows a
# CTA lost everywhere.
CONFIG = {"Q4_0": (8, 1), "Q8_0": (8, 1), "Q4_K": (8, 0), "Q5_K": (4, 0), "Q6_K": (4, 0)}
# The types whose register kernel takes the two-instruction dot (T<type>H, kernels/matvec_structs.py)
# for n <= 2, in every decode product of the type (decode_struct: the epilogue kernels, the MoE experts).


# The shared helpers (BF, dot16, load_x, block_sum, ...; pdl.cuh's PDL_PROLOGUE first) and the loop.
C_HEAD = source("matvec_common.cuh")


C_KERNEL = source("matvec_register_loop.cuh")

TYPES = tuple(CONFIG)


def c_source():
    """The kernels' CUDA C: the register decode products over float x, matvec_rows over each type's struct."""
    return includes("matvec_common.cuh", "matvec_float_structs.cuh", "matvec_register_loop.cuh")


def decode_struct(qtype):
    """The struct every decode product of qtype takes (matvec_rows, matvec_epilogue's matvec_fused_end, the MoE experts'
    moe_sorted_product / moe_decode_product): T<type>, or T<type>H, the two-instruction dot, for the FAST_DOT types."""
    return f"TQ{qtype[1:]}" + ("H" if qtype in FAST_DOT else "")


def kernel_name(qtype, n, fast, rows, prefetch):
    """The register kernel over qtype's float struct (fast: its two-instruction dot)."""
    return f"matvec_rows<TQ{qtype[1:]}{'H' if fast else ''}, {n}, {rows}, {prefetch}>"


@functools.lru_cache(maxsize=None)
def raw_module(device, qtype, config, ns=tuple(range(1, C_MAX_N + 1)), head=""):
    """The compiled kernels of one type and config (see CONFIG) for each n in ns (compiling is
    ~0.5 s a kernel, so launch() builds only the type and n it meets). head: pdl.source_head(pdl)."""
    import cupy
    names = [kernel_name(qtype, n, *config) for n in ns]
    return cupy.RawModule(code=head + c_source(), options=("--std=c++17",),
                          name_expressions=names)


@functools.lru_cache(maxsize=None)
def _kernel(device, qtype, config, n, head=""):
    return raw_module(device, qtype, config, (n,), head).get_function(kernel_name(qtype, n, *config))


def qualifies(qtype, blocks, x):
    """True when the CUDA C kernel can take these (device) arrays: aligned blocks and x."""
    return qtype in CONFIG and _ptr(blocks) % ALIGN[qtype] == 0 and _ptr(x) % 16 == 0


def plan(qtype, n):
    """(fast, rows a CTA, prefetch) of one launch of n rows of x: CONFIG's, the two-instruction dot
    for FAST_DOT types at n <= 2, at most 4 rows a CTA when n > 2 (R * n accumulators spill beyond)."""
    rows, prefetch = CONFIG[qtype]
    if n > 2:
        return False, min(rows, 4), prefetch
    return qtype in FAST_DOT, rows, prefetch


def launch(qtype, blocks, x, out, rows, cols, stream=None, cta=None, pdl=False, int8_dot_types=INT8_DOT_TYPES):
    """Enqueue out = x @ W.T on `stream` (a CuPy stream, None: the current one). Inputs are checked
    by the caller (matvec_basic): blocks 1-D uint8 of rows x cols, x (n, cols) and out (n, rows)
    C-contiguous float32, qualifies() true. The types int8_dot_types names run on dp4a over quantized x (matvec_q8), the others the register kernel; cta: (rows a
    CTA, prefetch) of the register kernel instead of plan()'s (tests). pdl: launched with PDL.
    One launch per C_MAX_N rows of x and no host synchronization: meant to be captured."""
    import cupy

    from lite.kernels import matvec_q8       # (it imports this module)
    device = cupy.cuda.runtime.getDevice()
    int8 = cta is None and matvec_q8.applies(qtype, int8_dot_types)
    with stream if stream is not None else contextlib.nullcontext():
        for i in range(0, x.shape[0], C_MAX_N):
            xs, os_ = x[i:i + C_MAX_N], out[i:i + C_MAX_N]
            n = xs.shape[0]
            if int8:
                matvec_q8.launch(qtype, blocks, xs, cupy.empty_like(xs), os_, rows, cols, pdl=pdl)
                continue
            cfg = plan(qtype, n) if cta is None else (False, min(cta[0], 4) if n > 2 else cta[0], cta[1])
            pdl_mod.call(_kernel(device, qtype, cfg, n, pdl_mod.source_head(pdl)),
                         ((rows + cfg[1] - 1) // cfg[1],), (THREADS,),
                         (blocks, xs, os_, np.int32(rows), np.int32(cols)), pdl=pdl)
