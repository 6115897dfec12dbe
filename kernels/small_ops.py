"""The small per-token kernels of the CUDA backend: RMSNorm (alone or after the residual add), RoPE,
the masked softmax of the materialized prefill attention (CUDA C in kernels/cuda/small_ops.cu), and
the gated activations (CuPy elementwise kernels).

They run many times a layer, and a CuPy RawKernel launch costs a fraction of a Numba launch's host
time, so this glue is CUDA C. Tests run the same C on the host through tests/cuda_c_emulator.py.
Every wrapper takes the CuPy stream to launch on and never synchronizes.
"""
import math

import cupy as cp
import numpy as np

from lite.kernels.cuda_source import source

_module = None


def _kernel(name):
    global _module
    if _module is None:
        _module = cp.RawModule(code="#include <cuda_fp16.h>\n" + source("small_ops.cu"),
                               options=("--std=c++17",))
    return _module.get_function(name)


def rms_norm(x, w, eps, stream):
    """x (..., n) f32 contiguous, w (n,) f32 -> new array."""
    n = x.shape[-1]
    rows = x.size // n
    y = cp.empty_like(x)
    threads = min(1024, max(32, 1 << (n - 1).bit_length()))
    _kernel("rms_norm")((rows,), (threads,), (x, w, y, np.int32(n), np.float32(eps)), stream=stream)
    return y


def add_rms_norm(a, b, w, eps, stream):
    """a, b (..., n) f32 contiguous, w (n,) -> (a + b, rms_norm(a + b) * w), one launch."""
    n = a.shape[-1]
    rows = a.size // n
    s, y = cp.empty_like(a), cp.empty_like(a)
    threads = min(1024, max(32, 1 << (n - 1).bit_length()))
    _kernel("add_rms_norm")((rows,), (threads,), (a, b, w, s, y, np.int32(n), np.float32(eps)),
                            stream=stream)
    return s, y


def rope(x, pos0, base, neox, n_rot, freq_scale, stream, pos_dev=None):
    """x (T, H, D) f32 contiguous -> rotated copy; positions from pos_dev (int64 (1,)) if given."""
    T, H, D = x.shape
    y = cp.empty_like(x)
    total = T * H * (n_rot // 2)
    _kernel("rope")((math.ceil(total / 256),), (256,),
                    (x, y, np.int32(T), np.int32(H), np.int32(D), np.int32(n_rot), np.int64(pos0),
                     pos_dev if pos_dev is not None else np.uint64(0), np.float64(base), np.float64(freq_scale), np.int32(bool(neox))), stream=stream)
    return y


def masked_softmax(scores, T, pos0, window, scale, stream, p16=None):
    """scores (..., G*T or T, S) f32 in place; rows r are queries r % T. With p16 (same shape,
    float16) the probabilities go there instead."""
    S = scores.shape[-1]
    rows = scores.size // S
    threads = min(1024, max(32, 1 << (S - 1).bit_length()))
    _kernel("masked_softmax")((rows,), (threads,), (scores, p16 if p16 is not None else np.uint64(0),
                                                    np.int32(rows), np.int32(S), np.int32(T),
                                                    np.int64(pos0), np.int32(window), np.float32(scale)),
                              stream=stream)
    return scores


silu_mul = cp.ElementwiseKernel("float32 g, float32 u", "float32 y",
                                "y = g / (1.0f + expf(-g)) * u", "lite_silu_mul")
gelu_tanh_mul = cp.ElementwiseKernel(
    "float32 g, float32 u", "float32 y",
    "y = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u",
    "lite_gelu_tanh_mul")
