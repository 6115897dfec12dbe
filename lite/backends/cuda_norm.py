"""LITE_FOLD_NORM=1 (opt-in until timed on a GPU): a decode token's RMSNorm folded into the products
that read it (kernels/matvec_epilogue.py's `mvn`: each CTA already loads all of x, so it also sums
x^2, multiplies x by the norm weights and scales its totals by rsqrt(mean + eps)). attn_norm ->
the fused q/k/v product, ffn_norm -> the gate/up product with the activation, output_norm -> the
output product: 2 launches a layer and one a token fewer (3.8 us each on the H200, llama 8B).

rms_norm returns a NormedLater (no launch) for x (T <= FOLD_MAX_TOKENS, n); the ops in TAKE launch
mvn on it where the weight has a matvec_cuda kernel, and every other op, or a weight without one
(F32 router, F16, IQ types), gets the materialized norm (`_arr`: the rms_norm kernel, once a marker).
Results agree with the separate norm to ~1e-6 relative, not bit for bit (x*g first, rsqrt last).

A mixin of CUDABackend (its w, k, cp, stream).
"""
import functools
import os

import numpy as np

from lite.kernels import matvec_cuda, matvec_epilogue

# Tokens a marker may hold: mvn has no spills at n <= 2 for every type (nvcc sm_90), several at n >= 5.
FOLD_MAX_TOKENS = 2
# CUDABackend ops that launch mvn on a NormedLater; all the others materialize it (MATERIALIZE:
# those that can meet rms_norm's output in llama/qwen3/qwen3moe/qwen2moe/gemma3, checked on the
# CPU by tests/test_fold_norm.py).
TAKE = ("linear", "linear_many", "linear_gated", "linear_add", "output")
MATERIALIZE = ("rms_norm", "add_rms_norm", "add", "scale", "act_mul", "sigmoid_gate", "moe_route",
               "moe_experts", "_matmul", "to_host")


class NormedLater:
    """What rms_norm returns with LITE_FOLD_NORM=1 for a few tokens' x (T, n): the input, the (n,)
    f32 weights and eps, applied by the next products' launches (mvn). `done` is the normed array
    once an op has needed it (CUDABackend._arr). Only CUDABackend's ops take it; anything else
    fails on it loudly."""

    def __init__(self, x, w, eps):
        self.x, self.w, self.eps, self.shape, self.done = x, w, eps, x.shape, None

    def __getattr__(self, name):
        raise TypeError(f"an RMSNorm left for the next product (NormedLater) has no {name!r}: "
                        f"pass it through CUDABackend._arr first (LITE_FOLD_NORM=1)")


class CUDAFoldNorm:
    @functools.cached_property
    def fold_norm(self):
        """LITE_FOLD_NORM=1: rms_norm of a few tokens is left for the products (read once a backend)."""
        return os.environ.get("LITE_FOLD_NORM", "0") == "1"

    def _norm_marker(self, x, name, eps):
        """rms_norm's hook: a NormedLater for x (T <= FOLD_MAX_TOKENS, n) f32, else None."""
        w = self.w[name].data
        if (self.fold_norm and x.ndim == 2 and x.shape[0] <= FOLD_MAX_TOKENS
                and x.dtype == np.float32 and w.dtype == np.float32 and w.shape == x.shape[-1:]
                and w.data.ptr % 16 == 0):
            return NormedLater(x, w, eps)
        return None

    def _arr(self, h):
        """h itself, or the norm a NormedLater left (the rms_norm kernel, one launch a marker)."""
        if not isinstance(h, NormedLater):
            return h
        if h.done is None:
            h.done = self.k.rms_norm(self.cp.ascontiguousarray(h.x), h.w, h.eps, self.stream)
        return h.done

    def _ready(self, h):
        """h as an array if it is one (or a NormedLater already materialized), else None."""
        if isinstance(h, NormedLater):
            return h.done
        return h

    def _norm_in(self, w, h):
        """Can mvn take NormedLater h (not yet materialized) times weight w?"""
        if not isinstance(h, NormedLater) or h.done is not None:
            return False
        return (w.data.ndim == 1 and w.qtype in matvec_cuda.CONFIG and w.shape[-1] == h.shape[1]
                and matvec_epilogue.supports(w.qtype, w.data, self.cp.ascontiguousarray(h.x)))

    def _product(self, x, w):
        """x @ W.T for x an array or a NormedLater (mvn where it can, else the norm, then _matmul)."""
        if self._norm_in(w, x):
            return self._epilogue_launch(w, x.x, None, norm=(x.w, x.eps))   # cuda_linear.py
        return self._matmul(self._arr(x), w)

    def moe_route(self, h, *args, **kwargs):
        return super().moe_route(self._arr(h), *args, **kwargs)

    def moe_experts(self, h, *args, **kwargs):
        return super().moe_experts(self._arr(h), *args, **kwargs)
