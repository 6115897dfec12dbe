"""The CUDA backend's ops of the hybrid (qwen3next): the Gated DeltaNet's conv, norms, gates and delta
rule (kernels/delta_rule.py), gated attention's output gate, and the per-layer recurrent state.

The same semantics as the CPU backend's "hybrid's ops" (lite/backends/cpu.py), float32 on the
backend's stream. The states are the stage's RecurrentState (lite/kv_cache.py), made with the
backend's array module, so they live on this device. A mixin of CUDABackend: it uses its cp, stream,
w (the weights) and _arr (lazy values of the norm split, cuda_norm.py, made arrays).
"""
import numpy as np


def _dr():
    """kernels/delta_rule.py, imported on first use: it needs CuPy, which this module must not
    (lite.backends.cuda is imported on machines without it to say why there is no GPU)."""
    from lite.kernels import delta_rule
    return delta_rule


class CUDARecurrent:
    def _small_f32(self, name):
        """A small weight (ssm_a, ssm_dt.bias, the conv taps) as a float32 device array in its numpy
        shape, converted once: the kernels read float32 whatever the file stores."""
        cache = self.__dict__.setdefault("_recurrent_f32", {})
        if name not in cache:
            w = self.w[name]
            if w.qtype in ("F32", "F16") and w.data.dtype != np.uint8:
                a = w.data.astype(np.float32)
            else:                          # quantized (or a 3-D F16 kept as bytes): its blocks
                from lite.kernels import dequantize
                a = dequantize(w.data.reshape(-1), w.qtype, np.float32, self.stream)
            cache[name] = self.cp.ascontiguousarray(a).reshape(w.shape)
        return cache[name]

    def sigmoid_mul(self, x, gate):
        """x * sigmoid(gate), elementwise (gated attention's output gate)."""
        return _dr().sigmoid_mul(self._arr(x), self._arr(gate), self.stream)

    def l2_norm(self, x, eps):                              # over the last axis
        return _dr().l2_norm(self._arr(x), eps, self.stream)

    def concat(self, xs):                                   # along the last axis
        with self.stream:
            return self.cp.concatenate([self._arr(x) for x in xs], axis=-1)

    def delta_gates(self, b, a, a_name, dt_bias_name):
        """beta = sigmoid(b); g = ssm_a * softplus(a + dt_bias), the log decay. (T, Hv) each."""
        return _dr().gates(self._arr(b), self._arr(a), self._small_f32(a_name), self._small_f32(dt_bias_name),
                           self.stream)

    def recurrent_state(self, kv, il, pos0, n_tokens):
        """The (conv, delta-rule) state of layer il that a chunk of n_tokens at pos0 updates in
        place (cleared on this stream when pos0 is 0)."""
        with self.stream:
            return kv.recurrent.take(il, pos0, n_tokens)

    def conv_silu(self, x, name, state):
        """silu(causal conv of x (T, C)), the window before x in state (K-1, C), updated in place."""
        w = self._small_f32(name)
        return _dr().conv_silu(self._arr(x), w.reshape(w.shape[0], -1), state, self.stream)

    def delta_rule(self, q, k, v, g, beta, state, scale):
        """The gated delta rule over a chunk: the recurrence for one token (decode), the chunked
        form for more; state (Hv, dk, dv) updated in place. -> (T, Hv, dv)."""
        dr = _dr()
        step = dr.decode if q.shape[0] == 1 else dr.chunked
        return step(q, k, v, g, beta, state, scale, self.stream)
