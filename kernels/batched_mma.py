"""Batched products on the tensor cores: out = x @ W.T for 9 to 256 rows of x over Q4_K, Q5_K, Q6_K, Q8_0, IQ4_XS
and IQ3_XXS weights (the latter in each GPU layout: the file's, IQ3_XXS_G4, IQ3_XXS_B16),
each weight tile dequantized once per 32 rows of x (the rest of x's rows find it in L2), no cuBLAS and no host
synchronization, so a server step of up to MAX_ROWS rows can be captured in a CUDA graph (lite/engine/paged_cuda.py).
As llama.cpp's MMQ: the weights dequantized inside the kernel into int8 tiles with their scales, x quantized to
int8, `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32` (Q6_K: m16n8k16, its scales go by 16 weights), fp32
sums of the scaled int32 products. CUDA C: kernels/cuda/batched_mma.cu (the product),
batched_mma_common.cuh (the mma, its host emulation, the x quantizer), batched_mma_weights.cuh (the K types and
Q8_0), batched_mma_iq.cuh (the IQ types).

x in two int8 parts, as kernels/matvec_q8.py's x quantizer: a run takes a = max |x|, t = x 127 / a,
hi = rint(t), lo = rint((t - hi) 254), x = d (254 hi + lo) with d = a / (127 254), off by at most a / 64,516;
the product is then W times quantized x up to fp32 rounding. Its quantizer (quantize_x) and record layout are
not reused: its runs are 16 values in each type's chunk order, each with its own d, while a k = 32 mma sums 32
consecutive columns under one scale; here (batched_quantize_x) runs are 32 consecutive columns (llama.cpp's
q8_1 blocks), in planes an mma's B fragments read directly: hi and lo (n, cols) int8, d and the run's sum of
quantized x (Q4_K's minimums meet it) (n, cols / 32) float.
"""
import contextlib
import functools

import numpy as np

from lite.kernels.cuda_source import source

# a weight's type as the GPU backend holds it at product time (kernels/gpu_layout.py: IQ3_XXS in one of its
# three layouts) -> the struct that dequantizes its tiles
STRUCTS = {"Q4_K": "BmmaQ4K", "Q5_K": "BmmaQ5K", "Q6_K": "BmmaQ6K", "Q8_0": "BmmaQ80", "IQ4_XS": "BmmaIq4Xs",
           "IQ3_XXS": "BmmaIq3Xxs", "IQ3_XXS_G4": "BmmaIq3XxsGroups4", "IQ3_XXS_B16": "BmmaIq3XxsBands16"}
TYPES = tuple(STRUCTS)
COLS = {"IQ3_XXS_G4": 1024}        # the columns a row must be a multiple of, where more than K_STEP
MIN_ROWS, MAX_ROWS = 9, 256        # rows of x it is meant for (below: the fused matvecs of kernels/matvec_q8)
CTA_ROWS, K_STEP = 64, 256         # weight rows a CTA (BMMA_ROWS), columns a K step (BMMA_K)
TILES = (8, 16, 32)                # rows of x a CTA (NT): the smallest tile that holds n, else the largest
ALIGN = {"Q4_K": 4, "Q5_K": 4, "Q6_K": 2, "Q8_0": 2, "IQ4_XS": 4, "IQ3_XXS": 2, "IQ3_XXS_G4": 8,
         "IQ3_XXS_B16": 16}        # the loads of a block's words and halves


def c_source():
    """The module text: the x quantizer and batched_mma_product."""
    return source("batched_mma.cu")


def tile(n):
    """Rows of x a CTA for n rows."""
    return next((t for t in TILES if t >= n), TILES[-1])


def kernel_name(qtype, nt):
    return f"batched_mma_product<{STRUCTS[qtype]}, {nt}>"


QUANTIZER = "batched_quantize_x"


def applies(qtype, cols):
    """True when the batched product takes a weight of this type and width."""
    return qtype in STRUCTS and cols % COLS.get(qtype, K_STEP) == 0


def grids(n, rows, cols):
    """(quantizer grid, product grid) for n rows of x and a rows x cols weight."""
    return ((cols // 32 + 3) // 4, n), ((n + tile(n) - 1) // tile(n), (rows + CTA_ROWS - 1) // CTA_ROWS)


@functools.lru_cache(maxsize=None)
def _module(device, names):
    import cupy
    return cupy.RawModule(code=c_source(), options=("--std=c++17",), name_expressions=list(names))


def quantize(x):
    """(hi, lo, d, s): x (n, cols) float32 quantized as the product reads it (one launch on CuPy's current stream)."""
    import cupy
    n, cols = x.shape
    x = cupy.ascontiguousarray(x, dtype=np.float32)
    hi, lo = cupy.empty((n, cols), np.int8), cupy.empty((n, cols), np.int8)
    d, s = cupy.empty((n, cols // 32), np.float32), cupy.empty((n, cols // 32), np.float32)
    mod = _module(cupy.cuda.runtime.getDevice(), (QUANTIZER,))
    mod.get_function(QUANTIZER)(grids(n, 1, cols)[0], (128,), (x, hi, lo, d, s, np.int32(cols)))
    return hi, lo, d, s


def launch(qtype, blocks, x, out, rows, cols, stream=None):
    """Enqueue out = x @ W.T on `stream` (CuPy; None: the current one): the quantizer, then the product (two
    launches, no host synchronization; meant to be captured). blocks: the weight's bytes as the file stores
    them; x (n, cols) float32; out (n, rows) float32, C-contiguous."""
    if not applies(qtype, cols):
        raise ValueError(f"batched_mma: no product for {qtype} with {cols} columns "
                         f"(have {', '.join(TYPES)}, columns a multiple of {K_STEP})")
    import cupy
    n = x.shape[0]
    if x.shape != (n, cols) or out.shape != (n, rows):
        raise ValueError(f"batched_mma: x {x.shape} and out {out.shape} for a {rows} x {cols} weight")
    name = kernel_name(qtype, tile(n))
    product = _module(cupy.cuda.runtime.getDevice(), (name,)).get_function(name)
    with stream if stream is not None else contextlib.nullcontext():      # (the scratch on its stream too)
        hi, lo, d, s = quantize(x)
        product(grids(n, rows, cols)[1], (128,), (blocks, hi, lo, d, s, out, np.int32(n), np.int32(rows),
                                                  np.int32(cols)))


def product(qtype, blocks, x, rows, cols, stream=None):
    """A new (n, rows) float32 array x @ W.T (launch's)."""
    import cupy
    with stream if stream is not None else contextlib.nullcontext():
        out = cupy.empty((x.shape[0], rows), np.float32)
        launch(qtype, blocks, x, out, rows, cols)
    return out
