"""IQ3_XXS's decode product on the tensor cores (session 12): `mvb`, over IQ3_XXS_B16 (kernels/iq3_b16.py: bands
of 16 rows laid out for the int8 mma's fragments). Registered as the IQ3_XXS_B16 matvec (lite bench kernels
IQ3_XXS_B16); since session 15 the GPU backend's layout for IQ3_XXS matrices of whole bands (lite/backends/cuda.py
_regroup_iq3; 8B IQ3_XXS decode 419 -> 500 tok/s on the H200).

A warp's mma.sync.m16n8k32.s8 takes 16 rows x 32 weights at once (mv_iq2 over IQ3_XXS_G4 spends ~112
instructions a chunk of 32 weights and a row). Of each pair of chunks, the even chunk's grid words (4 weights
each) come from a 4096-word table of signed words by their 12-bit fields (grid index | 4 signs), the odd
chunk's from the unsigned grid's 32 copies (lane l's in bank l) with the signs put on by XOR and taken back by
a second mma against -x. x goes in as qx's int8 parts (hi and lo a run of 16: B's columns hi_a, lo_a, hi_b,
lo_b; the odd chunk's in columns 4-7), in record layout 18 (kernels/matvec_q8.py lt_q8w: a lane's 4 words and
4 d of a block in two 16-byte loads). H200, kernel table (qxe + mvb; BENCHMARKS, session 16 calls 7 and 9):
4096x14336 9.5 us, 60.3% of copy-vec16 (median of 6 runs; IQ3_XXS_G4's mv_iq2 13.3, 43%), 14336x4096 11.3,
4096x4096 4.1. Session 16's mvb<8, 1, 1, 1, 1> (SG = 1 and each warp's first block decoded before the PDL wait,
config) took 4096x14336 from 9.77 to 9.43 us and 4096x4096 from 4.48 to 4.05 (forms_ab). The CUDA C:
kernels/matvec_mma_src.py.
Where the time goes (session 14, call 8, its diagnostics LT_MVB_DIAG_*): with no memory traffic at all the product takes 8.7 us alone (9.0 with it); taking
away its 12 mma a block saves 1.6 us, the signed table's lookups 0.8, the grid copies' 0.7. Lost since (each
in a commit, BENCHMARKS): every word through the grid's copies (16 mma a block), every word through the
table (32 conflicting lookups), -x from the quantizer, a band's K split over 2 CTAs; the signs by an add (SG, 8
mma a block) wins at 4 warps a CTA only; session 15: x quantized inside the product by clusters of CTAs through
distributed shared memory (mvbc, 1.4-2x slower) and the gated product writing the down product's x records (+5 us
at 28672x4096 with a counter a band pair, +1.7 us with 2 bands a CTA); session 16: the product starting on the
quantizer's count of CTAs done instead of its grid's end (ce093de: even), 12-16 warps a CTA (10.9-11.4 us).
"""
import functools

import numpy as np

from lite.kernels import iq3_b16, matvec_epilogue, matvec_mma_src
from lite.kernels import pdl as pdl_mod
from lite.kernels.registry import register_matvec

NAME = iq3_b16.NAME
# mvb<W, P, A, SG>: warps a CTA, blocks a warp has loaded ahead (the first before the PDL wait), A = 1 the signed
# table aligned (lt_b16_table), SG = 1 the odd chunk's signs by an add. 8 warps keep 2 CTAs an SM, 4 warps 4:
# where the bands pass 2 an SM, the smaller CTAs fill the rounds (sessions 12-13: 4096x14336 (8, 1) 9.91 us, (8, 2) 10.25; 14336x4096 (4, 2) 11.78, (4, 1)
# 13.7, (8, *) 15.0). A = 1 takes 65 KB a CTA (session 14, call 3, after qxe, A = 0 -> 1): 4096x14336 9.85 ->
# 9.79 us, 4096x4096 4.65 -> 4.46, 6144x4096 (4, 2) 6.35 -> 5.75 (3 CTAs an SM hold its 384), 14336x4096 (4, 2)
# 11.89 -> 14.44 (3 CTAs an SM where 4 fit: A = 0 there). SG = 1 (the signs by an add), after qxe, calls 9 / 11:
# 14336x4096 (4, 2, 0) 11.74 -> 11.43 / 11.67 -> 11.35, 6144x4096 (4, 2, 1) 5.79 -> 5.73 / 5.78 -> 5.70; at 8 warps
# 4096x14336 9.93 -> 11.33 / 9.75 -> 10.74 (SG = 0 there). A band's K in two halves over 2 CTAs (call 11, 4 warps,
# S = 2, commit 4165ed2): 4096x14336 11.41-11.79 against 9.75, 4096x4096 6.05 against 4.50: lost, removed.
# D = 1 (session 16): each warp's first block decoded before the PDL wait. After qxe (scripts/session16/forms_ab.py,
# call 6), (SG, D) = (0, 0) / (0, 1) / (1, 0) / (1, 1): 4096x14336 9.77 / 9.82 / 10.67 / 9.43 us, 4096x4096 4.48 /
# 4.29 / 4.96 / 4.05, 768x2048 2.32 / 2.28 / 2.27 / 2.35; at 4 warps D loses (call 7: 14336x4096 11.23 -> 12.08,
# 6144x4096 5.78 -> 5.74), and 8 warps lose there (13.86, 7.24). SG = 1 alone at 8 warps is session 14's loss again:
# ptxas schedules the loop differently with the first block peeled (590 -> 570 SASS instructions); not understood
# further. mvbe (the decode's epilogue forms) keeps (8, 1, 1, 0, 0): alone its (8, 1, 1, 1, 1) was faster (call 9,
# add + norm out + records: 4096x14336 11.89 -> 11.64 us, 4096x4096 6.73 -> 6.30) but 8B IQ3_XXS decode slower
# (call 10, 4 runs each alternating: 486.5-496.5 tok/s against 501.7-508.3); LITE_MVBE_PREDECODE=1 takes it,
# LITE_MVB_PREDECODE=0 puts the plain product back to (8, 1, 1, 0, 0).
ALIGN_DYN = 0x8000 - 16       # A = 1's dynamic shared memory: the 16 KB table 16 KB aligned wherever it starts


def config(rows, cols, sms, epilogue=False):
    """(warps, prefetch, align, signs_add, predecode) of mvb (mvbe with `epilogue`) for a rows x cols product on
    `sms` SMs."""
    bands = rows // 16
    if bands > 2 * sms:
        return (4, 2, int(bands <= 3 * sms), 1, 0)
    # the product decodes each warp's first block before the PDL wait; the epilogue forms do not (slower end to end)
    return (8, 1, 1, 0, 0) if epilogue else (8, 1, 1, 1, 1)


def c_source():
    """mvb's CUDA C (kernels/matvec_mma_src.py), after matvec_q8's IQ3_XXS text."""
    return matvec_mma_src.c_source()


def kernel_name(warps, prefetch, align=0, signs_add=0, predecode=0, epilogue=0, nm=0):
    d = ", 1" if predecode else ""
    if epilogue or nm:
        return f"mvbe<{warps}, {prefetch}, {align}, {signs_add}, {epilogue}, {nm}{d}>"
    return f"mvb<{warps}, {prefetch}, {align}, {signs_add}{d}>"


EPILOGUES = matvec_epilogue.EPILOGUES               # lt_mvb_end's E, mve's numbers


# The quantizer before mvb: qxe (kernels/matvec_q8.py), which lets mvb launch before it waits for the product
# before it (mvb's first loads, before its PDL wait, then meet that product's tail); records in layout 18.
# Session 12: after qx 12.1 us, after qxe 10.9 (mvb alone 9.8); quantizing in mvb's own CTAs with a grid
# barrier (3340ce5) lost: 12.6, and 6.3 against 4.5 at 4096x4096.
QUANTIZER = "qxe<TIQ3_XXS, 18>"


def module_head(pdl=False):
    """The defines a module of mvb starts with: PDL's."""
    return pdl_mod.source_head(pdl)


@functools.lru_cache(maxsize=None)
def _module(device, names, head):
    import cupy
    from lite.kernels import matvec_q8
    return cupy.RawModule(code=head + matvec_q8.c_source("IQ3_XXS") + c_source(), options=("--std=c++17",),
                          name_expressions=list(names))


@functools.lru_cache(maxsize=None)
def _sms(device):
    import cupy
    return cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]


def launch(records, x, out, rows, cols, stream=None, cta=None, epilogue=None, res=None, scale_in=None,
           norm_out=None, records_out=None, x_records=None, pdl=False):
    """Enqueue out = x @ W.T for IQ3_XXS_B16 records (what iq3_b16.repack made) on `stream` (CuPy; None: the
    current one): per row of x, QUANTIZER into a scratch buffer, then mvb (two launches under PDL, no
    host synchronization; meant to be captured into CUDA graphs). x (n, cols) float32, out (n, rows)
    float32; cta: (warps, prefetch[, align, signs_add, predecode]), default config(rows, cols, the device's SMs).
    As matvec_epilogue.launch (session 14; on the GPU since session 15): epilogue "add", out = x @ W.T + res (res
    shaped like out); "silu" / "gelu_tanh", W's rows [gate; up] interleaved (interleave_rows), out (n, rows /
    2) = act(gate) * up; scale_in (n,) f32: x is xg of a norm-out launch, the product is scaled by it;
    norm_out (g, eps, xg, part, scale, counter) with "add": also xg (n, rows) = out * g and scale (n,) =
    rsqrt(mean(out^2) + eps), part (n, rows / 16) f32 scratch, counter an int32 device scalar at 0 (left at 0);
    records_out (n, rows) f32-sized, with norm_out: xg quantized as QUANTIZER writes it, the x of a scale-in
    product after this one (which then needs no quantizer launch); x_records: such records of x, read in place
    of quantizing x (no QUANTIZER launch; x is then only checked for its shape)."""
    import contextlib

    import cupy
    from lite.kernels import matvec_q8
    iq3_b16.check_shape(rows, cols)
    device = cupy.cuda.runtime.getDevice()
    e = 0 if epilogue is None else EPILOGUES[epilogue]
    nm = 1 if norm_out is not None else 2 if scale_in is not None else 0
    warps, prefetch, align, sg, d = ((tuple(cta) + (0, 0, 0))[:5] if cta
                                     else config(rows, cols, _sms(device), epilogue=bool(e or nm)))
    if e == 1 and (res is None or res.shape != out.shape):
        raise ValueError(f"{NAME}: epilogue 'add' needs res shaped like out")
    if e >= 2 and out.shape[-1] * 2 != rows:
        raise ValueError(f"{NAME}: a gated epilogue writes rows / 2 = {rows // 2} columns, out has {out.shape[-1]}")
    if nm == 1 and (e != 1 or scale_in is not None):
        raise ValueError(f"{NAME}: norm_out goes with epilogue 'add' alone")
    if records_out is not None and (nm != 1 or rows % 256):
        raise ValueError(f"{NAME}: records_out goes with norm_out, rows a multiple of 256")
    names = (QUANTIZER, kernel_name(warps, prefetch, align, sg, d, e, nm))
    mod = _module(device, names, module_head(pdl))
    quant, mv = mod.get_function(names[0]), mod.get_function(names[1])
    dyn = ALIGN_DYN if align else 0
    if dyn and mv.max_dynamic_shared_size_bytes < dyn:
        mv.max_dynamic_shared_size_bytes = dyn        # past the 48 KB a CTA takes without asking
    with stream if stream is not None else contextlib.nullcontext():
        x = cupy.ascontiguousarray(x)
        if x_records is not None and x_records.shape != x.shape:
            raise ValueError(f"{NAME}: x_records {x_records.shape} for x {x.shape}")
        xq = cupy.empty_like(x) if x_records is None else x_records
        for i in range(x.shape[0]):
            if x_records is None:
                pdl_mod.call(quant, matvec_q8.quantize_grid(1, cols), (128,), (x[i], xq[i], np.int32(cols)), pdl=pdl)
            args = (records, xq[i], out[i], np.int32(rows), np.int32(cols))
            if e or nm:                                   # mve's arguments after cols; unread pointers as 0
                z = np.uint64(0)
                g, eps, xg, part, scale, counter = norm_out if nm == 1 else (z, 0.0, None, None, scale_in, z)
                args += (res[i] if e == 1 else z, g, xg[i] if nm == 1 else z, part[i] if nm == 1 else z,
                         scale[i:i + 1] if nm else z, counter, np.float32(eps),
                         records_out[i] if records_out is not None else z)
            pdl_mod.call(mv, (rows // 16,), (32 * warps,), args, shared_mem=dyn, pdl=pdl)


@register_matvec(NAME)
def _matvec(blocks, x, out, rows, cols, stream=None, pdl=False, int8_dot_types=None, reference=False):
    launch(blocks, x, out, rows, cols, stream, pdl=pdl)      # (its only kernel: x always quantized)
