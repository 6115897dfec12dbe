"""IQ3_XXS's decode product on the tensor cores over bands of 16 rows: the kernel `bands16_product` (and `bands16_product_fused_end`, the
same with the decode step's next op folded in), over IQ3_XXS_B16 (kernels/iq3_b16.py: bands of 16 rows laid
out for the int8 mma's fragments). Registered as the IQ3_XXS_B16 matvec; the GPU backend's layout for
IQ3_XXS matrices of whole bands (kernels/gpu_layout.py). The CUDA C: kernels/cuda/mma_iq3_b16.cuh (the int8 mma and
its host emulation, the tables, a block's products: band_block_product; band_decode_a and band_multiply_x, its two halves, for the
block decoded before the PDL wait) and mma_iq3_b16_body.cuh (band_fused_end_write, the decode step's next op folded into the
product: bands16_product_fused_end's epilogues and the next norm's first half, and band_quantize_run, the norm out's x
records for the product after it; then the kernel bands16_product_body, with the timeline
BANDS16_STAMPS). What each part does and what it was measured at: the comments beside it and below.

A warp's mma.sync.m16n8k32.s8 takes 16 rows x 32 weights at once (the integer-dot product over IQ3_XXS_G4
spends ~112 instructions a chunk of 32 weights and a row). Of each pair of chunks, the even chunk's grid words
(4 weights each) come from a 4096-word table of signed words by their 12-bit fields (grid index | 4 signs),
the odd chunk's from the unsigned grid's 32 copies (lane l's in bank l) with the signs put on by XOR and taken
back by a second mma against -x. x goes in as the quantizer's int8 parts (hi and lo a run of 16: B's columns
hi_a, lo_a, hi_b, lo_b; the odd chunk's in columns 4-7), in record layout 18 (kernels/matvec_q8.py x_record_word: a
lane's 4 words and 4 d of a block in two 16-byte loads). Its speed against the copy ceiling: BENCHMARKS.md.
"""
import functools
from collections import namedtuple

import numpy as np

from lite.kernels import iq3_b16
from lite.kernels.cuda_source import includes
from lite.kernels import pdl as pdl_mod
from lite.kernels.registry import register_matvec

NAME = iq3_b16.NAME
# The form of one launch, the kernel's template arguments: warps a CTA; blocks a warp has loaded ahead (the
# first before the PDL wait); align: the signed table 16 KB aligned in dynamic shared memory (65 KB a CTA);
# signs_add: the odd chunk's signs by an add (8 mma a block instead of 12); predecode: each warp's first
# block decoded before the PDL wait. config() picks the fastest measured form per shape (BENCHMARKS.md).
BandsForm = namedtuple("BandsForm", "warps prefetch align signs_add predecode", defaults=(0, 0, 0))
ALIGN_DYN = 0x8000 - 16       # align's dynamic shared memory: the 16 KB table 16 KB aligned wherever it starts


def config(rows, cols, sms, epilogue=False):
    """The BandsForm of bands16_product (bands16_product_fused_end with `epilogue`) for a rows x cols product on `sms` SMs: where the bands
    pass 2 an SM, CTAs of 4 warps (4 an SM) fill the rounds, the table aligned only where 3 CTAs an SM
    hold the bands; else 8 warps (2 CTAs an SM), predecoding in the plain product only (the epilogue
    forms with it were faster alone but slower end to end)."""
    bands = rows // 16
    if bands > 2 * sms:
        return BandsForm(4, 2, int(bands <= 3 * sms), 1, 0)
    return BandsForm(8, 1, 1, 0, 0) if epilogue else BandsForm(8, 1, 1, 1, 1)


def c_source():
    """bands16_product's CUDA C, after matvec_q8's IQ3_XXS text (which holds the x quantizer quantize_x_early,
    x_record_word, byte_sign_masks and the unsigned grid IQ3XXS_GRID)."""
    return includes("mma_iq3_b16.cuh", "mma_iq3_b16_body.cuh")


def kernel_name(form, epilogue=0, nm=0):
    """The kernel of a BandsForm (its fields as template arguments); epilogue, nm: bands16_product_fused_end's E and NM."""
    f = BandsForm(*form)
    d = ", 1" if f.predecode else ""
    if epilogue or nm:
        return f"bands16_product_fused_end<{f.warps}, {f.prefetch}, {f.align}, {f.signs_add}, {epilogue}, {nm}{d}>"
    return f"bands16_product<{f.warps}, {f.prefetch}, {f.align}, {f.signs_add}{d}>"


EPILOGUES = {"add": 1, "silu": 2, "gelu_tanh": 3}   # the epilogue numbers of the fused ends (matvec_epilogue too)


# The quantizer before bands16_product: quantize_x_early (kernels/matvec_q8.py), which lets bands16_product launch before it waits for the product
# before it (bands16_product's first loads, before its PDL wait, then meet that product's tail); records in layout 18.
QUANTIZER = "quantize_x_early<Iq3XxsBlock, 18>"


def module_head(pdl=False):
    """The defines a module of bands16_product starts with: PDL's."""
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
    current one): per row of x, QUANTIZER into a scratch buffer, then bands16_product (two launches under PDL, no
    host synchronization; meant to be captured into CUDA graphs). x (n, cols) float32, out (n, rows)
    float32; cta: a BandsForm (or its fields as a tuple), default config(rows, cols, the device's SMs).
    As matvec_epilogue.launch: epilogue "add", out = x @ W.T + res (res
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
    form = BandsForm(*cta) if cta else config(rows, cols, _sms(device), epilogue=bool(e or nm))
    if e == 1 and (res is None or res.shape != out.shape):
        raise ValueError(f"{NAME}: epilogue 'add' needs res shaped like out")
    if e >= 2 and out.shape[-1] * 2 != rows:
        raise ValueError(f"{NAME}: a gated epilogue writes rows / 2 = {rows // 2} columns, out has {out.shape[-1]}")
    if nm == 1 and (e != 1 or scale_in is not None):
        raise ValueError(f"{NAME}: norm_out goes with epilogue 'add' alone")
    if records_out is not None and (nm != 1 or rows % 256):
        raise ValueError(f"{NAME}: records_out goes with norm_out, rows a multiple of 256")
    names = (QUANTIZER, kernel_name(form, e, nm))
    mod = _module(device, names, module_head(pdl))
    quant, product = mod.get_function(names[0]), mod.get_function(names[1])
    dyn = ALIGN_DYN if form.align else 0
    if dyn and product.max_dynamic_shared_size_bytes < dyn:
        product.max_dynamic_shared_size_bytes = dyn        # past the 48 KB a CTA takes without asking
    with stream if stream is not None else contextlib.nullcontext():
        x = cupy.ascontiguousarray(x)
        if x_records is not None and x_records.shape != x.shape:
            raise ValueError(f"{NAME}: x_records {x_records.shape} for x {x.shape}")
        xq = cupy.empty_like(x) if x_records is None else x_records
        for i in range(x.shape[0]):
            if x_records is None:
                pdl_mod.call(quant, matvec_q8.quantize_grid(1, cols), (128,), (x[i], xq[i], np.int32(cols)), pdl=pdl)
            args = (records, xq[i], out[i], np.int32(rows), np.int32(cols))
            if e or nm:                                   # matvec_fused_end's arguments after cols; unread pointers as 0
                z = np.uint64(0)
                g, eps, xg, part, scale, counter = norm_out if nm == 1 else (z, 0.0, None, None, scale_in, z)
                args += (res[i] if e == 1 else z, g, xg[i] if nm == 1 else z, part[i] if nm == 1 else z,
                         scale[i:i + 1] if nm else z, counter, np.float32(eps),
                         records_out[i] if records_out is not None else z)
            pdl_mod.call(product, (rows // 16,), (32 * form.warps,), args, shared_mem=dyn, pdl=pdl)


@register_matvec(NAME)
def _matvec(blocks, x, out, rows, cols, stream=None, pdl=False, int8_dot_types=None, reference=False):
    launch(blocks, x, out, rows, cols, stream, pdl=pdl)      # (its only kernel: x always quantized)
