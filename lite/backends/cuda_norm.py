"""BackendConfig.fold_norm (on by default): a decode token's RMSNorm split across the launches
around it, so that it costs no launch of its own (65 launches a token on the llama 8B shape).

In llama's decode step every norm but the first follows a residual add that a product already
does (linear_add: the attention-output and down products, kernels/matvec_epilogue.py "add"):

  linear_add(x, W, res)  ->  AddLater: the launch is held back until the next op shows its use;
  rms_norm(AddLater, g)  ->  one launch of the product with the norm out: it writes out (the
                             residual stream) and xg = out * g, each CTA its sum of out^2, and the
                             last CTA to finish scale = rsqrt(mean + eps); returns a ScaledLater;
  products of ScaledLater ->  the scale-in kernels: the plain product of xg, each total times
                             scale at the end (fused q/k/v, gate/up with the activation, output).

Any other op gets arrays (`as_array`: an AddLater launched as a plain linear_add, a ScaledLater
multiplied out, each once). Results agree with the separate rms_norm to ~1e-6 relative, not bit for
bit (the sums of squares in another order, the scale after the product). An MoE layer's ffn_norm
feeds the router, which takes arrays: that norm stays one launch (feeds_router).

Why one scale a token from the producer's last CTA: the norm inside the products' loop (x * g and
the sums of x^2 per chunk) costs registers and slowed the gated product by half; every consumer
CTA summing the producer's partial sums itself made the output product (16K CTAs) slower. A mixin of CUDABackend (its w, cp, stream, and norm_counter made in its
__init__: the int32 the producer's CTAs count on, left at 0 by each launch).
"""
import numpy as np

from lite.kernels import gpu_layout, matvec_epilogue

# CUDABackend ops that take a ScaledLater (the scale-in launch where the weight has a matvec_cuda
# kernel); all the others materialize lazy inputs (MATERIALIZE: those that can meet rms_norm's or
# linear_add's output in llama/qwen3/qwen3moe/qwen2moe/gemma3, checked on the CPU by
# tests/test_decode_folds.py).
TAKE = ("linear", "linear_many", "linear_gated", "output")
MATERIALIZE = ("rms_norm", "add_rms_norm", "add", "scale", "act_mul", "sigmoid_gate", "moe_route",
               "moe_experts", "matmul", "linear_add", "to_host", "done")


class _Later:
    """A value whose launch is held back (the classes below). Only CUDABackend's ops take one;
    anything else fails on it loudly. `done` is the array once it has been launched."""
    WHAT = ""

    def __getattr__(self, name):
        raise TypeError(f"{self.WHAT} ({type(self).__name__}) has no {name!r}: pass it through "
                        f"CUDABackend.as_array first (lite/backends/cuda_norm.py)")


class AddLater(_Later):
    """What linear_add returns for one token (the norm split): res + x @ W.T, not launched
    yet; launched by rms_norm with the norm out, or by as_array."""
    WHAT = "a residual add left for the next norm"

    def __init__(self, x, w, res):
        self.x, self.w, self.res, self.shape, self.done = x, w, res, res.shape, None


class ScaledLater(_Later):
    """rms_norm(x) * g as the norm-out launch left it: xg = x * g (T, n) and scale (T,) =
    rsqrt(mean x^2 + eps); `done` once an op has needed the normed array whole."""
    WHAT = "an RMSNorm left for the next product"

    def __init__(self, xg, scale, records=None):
        # records: xg quantized as IQ3_XXS_B16's products read x (the norm-out launch wrote them), or None
        self.xg, self.scale, self.records, self.shape, self.done = xg, scale, records, xg.shape, None


def feeds_router(weights, norm_name):
    """Does this norm feed an MoE router (blk.N.ffn_norm of a layer with ffn_gate_inp)?"""
    return norm_name.endswith("ffn_norm.weight") and \
        norm_name[: -len("ffn_norm.weight")] + "ffn_gate_inp.weight" in weights


class CUDAFoldNorm:
    @property
    def fold_norm(self):
        """Decode norms split across the products (BackendConfig.fold_norm)."""
        return self.config.fold_norm

    def add_later(self, x, w, res):
        """linear_add's hook: an AddLater for one token's res + x @ W.T, else None."""
        if (self.fold_norm and x.ndim == 2 and x.shape[0] == 1 and w.data.ndim == 1
                and self.supports_epilogue(w, self.cp.ascontiguousarray(x))):
            return AddLater(self.cp.ascontiguousarray(x), w, self.cp.ascontiguousarray(res))
        return None

    def norm_out_launch(self, x, name, eps):
        """rms_norm's hook: for an AddLater not yet launched, its launch with the norm out and a
        ScaledLater; else None."""
        if not isinstance(x, AddLater) or x.done is not None or feeds_router(self.w, name):
            return None
        g = self.w[name].data
        if g.dtype != np.float32 or g.shape != x.shape[-1:]:
            return None
        cp, w = self.cp, x.w
        T, rows = x.shape
        out, xg = cp.empty((T, rows), np.float32), cp.empty((T, rows), np.float32)
        opts = self.kernel_options
        part = cp.empty((T, matvec_epilogue.norm_parts(w.qtype, T, rows, opts["int8_dot_types"])), np.float32)
        scale = cp.empty(T, np.float32)
        # IQ3_XXS_B16: xg also quantized for the B16 products after the norm (no quantizer launch there)
        records = cp.empty((T, rows), np.float32) if gpu_layout.reads_x_records(w.qtype) and rows % 256 == 0 else None
        matvec_epilogue.launch(w.qtype, w.data, x.x, out, rows, w.shape[-1], "add", x.res,
                               self.stream, norm_out=(g, eps, xg, part, scale, self.norm_counter),
                               records_out=records, pdl=opts["pdl"], int8_dot_types=opts["int8_dot_types"])
        x.done = out
        return ScaledLater(xg, scale, records)

    def as_array(self, h):
        """h itself, or what a lazy value stands for (launched once)."""
        if isinstance(h, AddLater):
            if h.done is None:
                h.done = self.epilogue_launch(h.w, h.x, "add", h.res)          # cuda_linear.py
            return h.done
        if isinstance(h, ScaledLater):
            if h.done is None:
                h.done = h.xg * h.scale[:, None]        # (on the backend's stream, as `add`)
            return h.done
        return h

    def materialized(self, h):
        """h as an array if it is one (or a lazy value already materialized), else None."""
        if isinstance(h, _Later):
            return h.done
        return h

    def takes_scaled(self, w, h):
        """Can the scale-in kernel take ScaledLater h (not yet materialized) times weight w?"""
        if not isinstance(h, ScaledLater) or h.done is not None:
            return False
        return (w.data.ndim == 1 and w.shape[-1] == h.shape[1] and self.supports_epilogue(w, h.xg))

    def folded_product(self, x, w):
        """x @ W.T for x an array or a ScaledLater (the scale-in kernel where it can)."""
        if self.takes_scaled(w, x):
            return self.epilogue_launch(w, x.xg, None, scale_in=x.scale, x_records=self.records_for(w, x))
        return self.matmul(self.as_array(x), w)

    def done(self, x):
        """The stage's output as an array (the last layer's residual add may be lazy)."""
        return self.as_array(x)

    def moe_route(self, h, *args, **kwargs):
        return super().moe_route(self.as_array(h), *args, **kwargs)

    def moe_experts(self, h, *args, **kwargs):
        return super().moe_experts(self.as_array(h), *args, **kwargs)
