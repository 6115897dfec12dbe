"""The CUDA backend's matrix products (a mixin of CUDABackend, lite/backends/cuda.py).

Over many tokens (prefill) a weight is dequantized to fp16 into the backend's scratch buffer and
multiplied with cuBLAS (fp16 inputs, fp32 accumulation); over a few (decode) the fused
dequantize-and-dot kernels run (lite.kernels.matvec); with BackendConfig.batched_mma, 9 to 256 rows
(a server step) run on the tensor cores (kernels/batched_mma.py), capturable in a graph; and where the next op can ride along, the
epilogue kernels of kernels/matvec_epilogue.py: the residual add (linear_add) or the FFN's gated
activation (linear_gated). With the norm split (cuda_norm.py) linear_add may return an AddLater
and an input may be a ScaledLater: folded_product and _one_launch take the latter, everything else
materializes lazy values with as_array.
"""
import functools

import numpy as np

from lite.backends.cuda_moe import FUSED_MAX_TOKENS
from lite.kernels import batched_mma, matvec_epilogue

SPLIT_MAX_TOKENS = 4 * FUSED_MAX_TOKENS    # up to this many rows: fused matvecs of 8 rows each


class CUDALinear:
    @functools.cached_property
    def kernel_options(self):
        """What the decode products take from BackendConfig: PDL (self.pdl, resolved), the types on
        dp4a over quantized x, the Numba twins instead of the CUDA C kernels."""
        return dict(pdl=self.pdl, int8_dot_types=tuple(self.config.int8_dot_types),
                    reference=self.config.reference_kernels)

    @property
    def _epilogues(self):
        """Decode products with the residual add or the FFN activation folded in (BackendConfig.epilogues)."""
        return self.config.epilogues

    def supports_epilogue(self, w, x):
        return matvec_epilogue.supports(w.qtype, w.data, x, int8_dot_types=self.kernel_options["int8_dot_types"])

    def _dequant_f16(self, w):
        from lite.kernels import gpu_layout
        n = int(np.prod(w.shape))
        if self._scratch is None or self._scratch.size < n:
            self._scratch = self.cp.empty(max(n, self.scratch_elems), np.float16)
        return gpu_layout.dequantize_matrix(w.data, w.qtype, w.shape[-2], w.shape[-1], np.float16, self.stream,
                                            out=self._scratch[:n], reference=self.config.reference_kernels)

    def matmul(self, x, w):                                # (T, in) @ W(out, in).T -> (T, out) f32
        from lite.kernels import get_matvec, matvec
        cp = self.cp
        x = self.as_array(x)              # a lazy value (the norm split, lite/backends/cuda_norm.py)
        rows, cols = w.shape[-2], w.shape[-1]
        T = x.shape[0]
        if w.qtype == "F32":
            return x @ w.data.T
        if self._batched(w, T):
            return batched_mma.product(w.qtype, w.data, cp.ascontiguousarray(x, dtype=np.float32), rows, cols,
                                       self.stream)
        if w.qtype not in ("F16",) and T <= SPLIT_MAX_TOKENS and get_matvec(w.qtype) is not None:
            x = cp.ascontiguousarray(x)
            if T <= FUSED_MAX_TOKENS:
                return matvec(w.data, w.qtype, x, rows, cols, self.stream, **self.kernel_options)
            # a server step of a few more rows: the weight read once per 8 rows still moves less
            # than its fp16 dequantization (written, then read by the GEMM)
            return cp.concatenate([matvec(w.data, w.qtype, x[r:r + FUSED_MAX_TOKENS], rows, cols,
                                          self.stream, **self.kernel_options)
                                   for r in range(0, T, FUSED_MAX_TOKENS)])
        w16 = w.data if w.qtype == "F16" else self._dequant_f16(w).reshape(rows, cols)
        return gemm_f16_f32(cp, x.astype(np.float16), w16, self.stream)

    def _batched(self, w, T):
        """Does a product of T rows with w take the tensor-core batched product (BackendConfig.batched_mma)?"""
        return (self.config.batched_mma and FUSED_MAX_TOKENS < T <= batched_mma.MAX_ROWS and w.data.ndim == 1
                and batched_mma.applies(w.qtype, w.shape[-1]))

    def graph_rows(self):
        """The most rows of a step whose products can all be captured in a graph (lite/engine/paged_cuda.py
        max_rows): past SPLIT_MAX_TOKENS a product goes to cuBLAS, unless BackendConfig.batched_mma is on
        and its kernels take every weight a step multiplies (then batched_mma.MAX_ROWS)."""
        if self.config.batched_mma and all(batched_mma.applies(w.qtype, w.shape[-1])
                                           for w in self.multiplied_weights()):
            return batched_mma.MAX_ROWS
        return SPLIT_MAX_TOKENS

    def linear(self, x, name):
        y = self.folded_product(x, self.w[name])
        bias = name[: -len("weight")] + "bias"
        if bias in self.w:
            y += self.w[bias].data
        return y

    def linear_many(self, x, names):
        """Products of one input with several weights; a fused group runs as one product."""
        group = self.fused.get(tuple(names))
        if group is None:
            return [self.linear(x, n) for n in names]
        w, rows, interleaved = group
        y = self.folded_product(x, w)
        if interleaved:               # [gate; up] rows alternating (cuda.py _interleave): views
            parts = [y[:, 0::2], y[:, 1::2]]
        else:
            offs = np.cumsum([0] + rows)
            parts = [y[:, a:b] for a, b in zip(offs[:-1], offs[1:])]
        outs = []
        for n, part in zip(names, parts):
            bias = n[: -len("weight")] + "bias"
            outs.append(part + self.w[bias].data if bias in self.w else part)
        return outs

    def linear_add(self, x, name, res):
        """res + x @ W.T: for a few tokens one launch (kernels/matvec_epilogue.py), else the
        product and an add. For one token an AddLater (the norm split, cuda_norm.py)."""
        res = self.as_array(res)
        if name[: -len("weight")] + "bias" not in self.w:
            xa = self.materialized(x)
            later = None if xa is None or not self._epilogues else self.add_later(xa, self.w[name], res)
            if later is not None:
                return later
            out = self._one_launch(self.w[name], x, "add", res)
            if out is not None:
                return out
        return res + self.linear(x, name)

    def linear_gated(self, x, names, act):
        """act(x @ gate.T) * (x @ up.T): for a few tokens one launch over the fused [gate; up]
        (kernels/matvec_epilogue.py), else linear_many and act_mul."""
        group = self.fused.get(tuple(names))
        biased = any(n[: -len("weight")] + "bias" in self.w for n in names)
        if (group is not None and not biased and len(group[1]) == 2
                and group[1][0] == group[1][1] and act in matvec_epilogue.EPILOGUES):
            out = self._one_launch(group[0], x, act, interleaved=group[2])
            if out is not None:
                return out
        gate, up = self.linear_many(x, names)
        return self.act_mul(gate, up, act)

    def _one_launch(self, w, x, epilogue, res=None, interleaved=False):
        """x @ W.T with the epilogue ("add" with res, or a gated activation over W = [gate; up]) in
        one launch, x an array or a ScaledLater (then scaled inside the same launch); None where
        the kernels cannot take them (BackendConfig.epilogues off, too many tokens, other types)."""
        if not self._epilogues:
            return None
        if self.takes_scaled(w, x):
            return self.epilogue_launch(w, x.xg, epilogue, res, scale_in=x.scale,
                                         interleaved=interleaved, x_records=self.records_for(w, x))
        xa = self.materialized(x)
        if (xa is None or xa.shape[0] > FUSED_MAX_TOKENS or w.data.ndim != 1
                or not self.supports_epilogue(w, self.cp.ascontiguousarray(xa))):
            return None
        return self.epilogue_launch(w, xa, epilogue, res, interleaved=interleaved)

    def records_for(self, w, x):
        """A ScaledLater's x records where weight w's product reads them (IQ3_XXS_B16), else None."""
        from lite.kernels import gpu_layout
        return x.records if gpu_layout.reads_x_records(w.qtype) else None

    def epilogue_launch(self, w, x, epilogue, res=None, scale_in=None, interleaved=False, x_records=None):
        """kernels/matvec_epilogue.launch for weight w and the array x (see there)."""
        cp = self.cp
        x = cp.ascontiguousarray(x)
        rows = w.shape[-2]
        out = cp.empty((x.shape[0], rows if epilogue in (None, "add") else rows // 2), np.float32)
        if res is not None:
            res = cp.ascontiguousarray(res)
        opts = self.kernel_options
        matvec_epilogue.launch(w.qtype, w.data, x, out, rows, w.shape[-1], epilogue, res,
                               self.stream, scale_in=scale_in, interleaved=interleaved, x_records=x_records,
                               pdl=opts["pdl"], int8_dot_types=opts["int8_dot_types"])
        return out

    def output(self, x):
        name = "output.weight" if "output.weight" in self.w else "token_embd.weight"
        return self.folded_product(x, self.w[name])


def gemm_f16_f32(cp, x16, w16, stream):
    """(T, in) f16 @ (out, in).T f16 -> (T, out) f32, fp32 accumulation (cublasGemmEx)."""
    from cupy_backends.cuda.libs import cublas
    T, k = x16.shape
    n_out = w16.shape[0]
    y = cp.empty((T, n_out), np.float32)
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, stream.ptr)
    one = np.array(1.0, np.float32)
    zero = np.array(0.0, np.float32)
    # Row-major Y = X W^T is column-major Y^T = W X^T: A = W (k x out, transposed), B = X (k x T).
    cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n_out, T, k,
                  one.ctypes.data, w16.data.ptr, 2, k, x16.data.ptr, 2, k,
                  zero.ctypes.data, y.data.ptr, 0, n_out, cublas.CUBLAS_COMPUTE_32F,
                  cublas.CUBLAS_GEMM_DEFAULT)
    return y
