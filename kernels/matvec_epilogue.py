"""Decode matvec with the next op folded into its end: one launch instead of two, a use (issue 4's
decode step: 10 launches a layer -> 8). CUDA C on kernels/matvec_cuda.py's register kernel (its
loop `matvec_rows_partials`, CONFIG's rows a CTA and prefetch; over quantized x, matvec_q8's structs and CTA
shapes, IQ3_XXS's included), only the end differs:

  add        out = x @ W.T + res: the residual add after the attention-output and down products,
             so the next norm is a plain rms_norm and the separate add is gone.
  silu,      W = [gate; up] as the backend fuses them (rows = 2F): a CTA takes R/2 output units,
  gelu_tanh  i.e. gate rows u0.. and up rows F+u0.., and writes act(g) * u as (n, F): the FFN's
             activation, so act_mul is gone. No weight is reordered: only the CTA's row pointers.

  norm out   with "add" (lite/backends/cuda_norm.py): the next RMSNorm split across this launch
             and the products that read it. This one also writes xg = out * g (the norm's
             weights) and each CTA's sum of out^2 (a fixed order, no atomics: deterministic);
  scale in   any of the above, or none, over such an xg: the CTA sums the producer's partial sums
             after its loop and scales its totals by rsqrt(mean + eps) before the epilogue.
             Neither touches the loop (folding the norm into the loop, x * g and the sum of
             x^2 per chunk, cost registers and made the gated product much slower).

The add and the activations are written as cupy_ops' (`a + b`, silu_mul, gelu_tanh_mul), so a
decode step's results do not depend on whether the epilogue ran (same fp32 operations in the same
order). Checked in CI by tests/test_matvec_epilogue.py through the g++ emulator, against NumPy.
Launches enqueue on the given stream and never synchronize the host: meant for captured graphs.
"""
import contextlib
import functools

import numpy as np

from lite.kernels import matvec_cuda as mc
from lite.kernels import matvec_q8
from lite.kernels import pdl as pdl_mod
from lite.kernels.cuda_source import source

C_LAST_OF_COLUMN = source("last_block_to_count.cuh")   # the split merge's hand-off (kernels/cuda/)

from lite.kernels.matvec_mma import EPILOGUES  # noqa: E402  (one numbering for both fused ends)

C_EPI = source("matvec_epilogue.cuh")


def c_source(head="", q8=False, iq3=False):
    """head: pdl.source_head(pdl) (programmatic dependent launch, kernels/pdl.py); q8: with
    matvec_q8's integer structs (only where used: the default kernels keep their text); iq3: on
    IQ3_XXS's integer-dot module instead (matvec_q8.c_source: the IQ3 structs, their tables, matvec_rows_partials)."""
    if iq3:
        return head + matvec_q8.c_source("IQ3_XXS") + C_LAST_OF_COLUMN + C_EPI
    return head + mc.c_source() + (matvec_q8.structs("Q4_K") if q8 else "") + C_LAST_OF_COLUMN + C_EPI


def kernel_name(qtype, n, rows_per_cta, prefetch, e, nm=0, interleaved=False, q8=None):
    """q8: over matvec_q8's quantized x (None: where matvec_q8.applies by default)."""
    q8 = matvec_q8.applies(qtype) if q8 is None else q8
    struct = matvec_q8.struct(qtype) if q8 else mc.decode_struct(qtype)
    return (f"matvec_fused_end<{struct}, {n}, {rows_per_cta}, {prefetch}, {e}, {nm}"
            + (", true>" if interleaved else ">"))


def config(qtype, n, q8=None):
    """(rows a CTA, prefetch): CONFIG's register kernel (matvec_q8's over quantized x: q8, None
    where matvec_q8.applies by default), at most 4 rows a CTA when n > 2 (as matvec_cuda.plan); always even,
    so a gated CTA takes R/2 units."""
    q8 = matvec_q8.applies(qtype) if q8 is None else q8
    rows_per_cta, prefetch = matvec_q8.config(qtype) if q8 else mc.CONFIG[qtype]
    return (min(rows_per_cta, 4) if n > 2 else rows_per_cta), prefetch


# Tokens the norm-out launch takes (its R * n totals must fit one warp: R <= 8 at n <= 2).
NORM_MAX_TOKENS = 2


def interleave_rows(F):
    """Row order of [gate; up] (2F rows) for interleaved=True: gate u, up u, gate u+1, ... so that a
    gated CTA's rows are contiguous, and the product over all rows is [gate; up]'s at columns
    0::2 and 1::2 (strided views, no copy)."""
    u = np.arange(F)
    return np.stack([u, F + u], 1).reshape(-1)


def norm_parts(qtype, n, rows, int8_dot_types=mc.INT8_DOT_TYPES):
    """Partial sums of squares a norm-out launch writes per token (its CTAs)."""
    if qtype == "IQ3_XXS_B16":
        return rows // 16                                  # bands16_product_fused_end: a CTA a band of 16 rows
    return -(-rows // config(qtype, n, matvec_q8.applies(qtype, int8_dot_types))[0])


@functools.lru_cache(maxsize=None)
def _kernel(device, name, head=""):
    import cupy
    return cupy.RawModule(code=c_source(head, q8=matvec_q8.in_name(name), iq3="<Iq3XxsBlock" in name),
                          options=("--std=c++17",), name_expressions=[name]).get_function(name)


def supports(qtype, blocks, x, int8_dot_types=mc.INT8_DOT_TYPES):
    """True when matvec_fused_end can take these device arrays (matvec_cuda's types and alignment; IQ3_XXS, in
    either layout, only on its integer-dot structs); IQ3_XXS_B16: kernels/matvec_mma.py's bands16_product_fused_end."""
    if qtype == "IQ3_XXS_B16":
        return x.dtype == np.float32
    if qtype.startswith("IQ3_XXS"):
        return matvec_q8.qualifies(qtype, blocks, x, int8_dot_types)
    return mc.qualifies(qtype, blocks, x)


def launch(qtype, blocks, x, out, rows, cols, epilogue, res=None, stream=None, norm_out=None,
           scale_in=None, interleaved=False, records_out=None, x_records=None, pdl=False,
           int8_dot_types=mc.INT8_DOT_TYPES):
    """Enqueue matvec_fused_end on `stream`. blocks: W (rows, cols) as GGUF blocks, 1-D uint8; x (n, cols) f32
    C-contiguous. epilogue "add": out (n, rows) = x @ W.T + res, res (n, rows) f32 C-contiguous.
    "silu" / "gelu_tanh": rows = 2F, out (n, F) = act(x @ W[:F].T) * (x @ W[F:].T). None (only
    with scale_in): out (n, rows) = the product.
    norm_out (g, eps, xg, part, scale, counter), with "add" and n <= NORM_MAX_TOKENS: also xg (n,
    rows) = out * g (g (rows,) f32) and scale (n,) f32 = rsqrt(mean(out^2) + eps); part (n,
    norm_parts(...)) f32 is scratch, counter an int32 device scalar at 0 (left at 0).
    scale_in: scale (n,) as norm_out left it, x its xg: the product is of rms_norm(out) * g.
    interleaved (gated): W's rows are in interleave_rows' order. One launch per matvec_cuda.C_MAX_N
    rows of x. The types int8_dot_types names run over quantized x; pdl: launched with PDL.
    IQ3_XXS_B16 goes to kernels/matvec_mma.launch (records_out, x_records: its x records)."""
    import cupy
    if qtype == "IQ3_XXS_B16":                             # bands16_product_fused_end (kernels/matvec_mma.py), the same contract
        from lite.kernels import matvec_mma
        if epilogue not in (None, "add") and not interleaved:
            raise ValueError("IQ3_XXS_B16's gated product takes [gate; up] rows interleaved")
        matvec_mma.launch(blocks, x, out, rows, cols, stream, epilogue=epilogue, res=res, scale_in=scale_in,
                          norm_out=norm_out, records_out=records_out, x_records=x_records, pdl=pdl)
        return
    if records_out is not None or x_records is not None:
        raise ValueError("x's records (records_out, x_records) go with IQ3_XXS_B16 (kernels/matvec_mma.py)")
    e = 0 if epilogue is None else EPILOGUES[epilogue]
    nm = 1 if norm_out is not None else 2 if scale_in is not None else 0
    width = rows if e <= 1 else rows // 2
    if e == 1 and (res is None or res.shape != out.shape):
        raise ValueError("epilogue 'add' needs res shaped like out")
    if e >= 2 and rows % 2:
        raise ValueError(f"a gated epilogue needs [gate; up] rows (an even count), got {rows}")
    if interleaved and e < 2:
        raise ValueError("interleaved rows go with a gated epilogue")
    if e == 0 and nm != 2:
        raise ValueError("no epilogue and no scale_in: that is matvec_cuda.launch")
    if nm == 1 and (e != 1 or x.shape[0] > NORM_MAX_TOKENS or scale_in is not None):
        raise ValueError(f"norm_out goes with epilogue 'add' alone, at most {NORM_MAX_TOKENS} tokens")
    if nm == 2 and x.shape[0] > mc.C_MAX_N:
        raise ValueError(f"scale_in takes at most {mc.C_MAX_N} tokens (one launch)")
    device = cupy.cuda.runtime.getDevice()
    head = pdl_mod.source_head(pdl)
    q8 = matvec_q8.applies(qtype, int8_dot_types)
    with stream if stream is not None else contextlib.nullcontext():
        for i in range(0, x.shape[0], mc.C_MAX_N):
            xs, os_ = x[i:i + mc.C_MAX_N], out[i:i + mc.C_MAX_N]
            rs = res[i:i + mc.C_MAX_N] if e == 1 else os_      # otherwise res is never read
            g, eps, xg, part, scale, counter = os_, 0.0, os_, os_, os_, os_   # (unread without NM)
            if nm == 1:
                g, eps, xg, part, scale, counter = norm_out
            elif nm == 2:
                scale = scale_in
            n = xs.shape[0]
            if q8:                                             # x quantized for the integer-dot structs
                xs = matvec_q8.quantize(qtype, xs, pdl)
            r, p = config(qtype, n, q8)
            units = r if e <= 1 else r // 2
            func = _kernel(device, kernel_name(qtype, n, r, p, e, nm, interleaved, q8), head)
            grid, args = ((width + units - 1) // units,), (
                blocks, xs, os_, np.int32(rows), np.int32(cols), rs, g, xg, part, scale, counter,
                np.float32(eps))
            pdl_mod.call(func, grid, (mc.THREADS,), args, pdl=pdl)   # (on the current stream)
