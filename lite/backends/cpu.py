"""The CPU backend: NumPy, float32. The reference every GPU result is checked against.

Weights are dequantized to float32 when a stage loads them (gguf.quants does the block arithmetic),
except the token embedding, which stays in its GGUF blocks and is dequantized a row at a time on
lookup; when the output projection is tied to it, the full table is dequantized once, on first use.
"""
import logging
import math

import numpy as np
from gguf import quants as gguf_quants

from lite.backends.cpu_recurrent import causal_conv_silu, delta_rule_chunked, delta_rule_recurrent
from lite.backends.ops import Ops
from lite.errors import UnsupportedQuantError

log = logging.getLogger(__name__)


def dequantize_tensor(t) -> np.ndarray:
    """A GGUF tensor as float32 in numpy order."""
    rows = t.raw.reshape(-1, t.nbytes // max(1, t.n_elements // t.shape[-1]))
    try:
        w = gguf_quants.dequantize(rows, t.qtype)
    except NotImplementedError:
        raise UnsupportedQuantError(f"tensor {t.name}: quant type {t.type_name} cannot be "
                                    f"dequantized on the CPU") from None
    return np.ascontiguousarray(w.reshape(t.shape), dtype=np.float32)


class HostHandoff:
    """Hand-off between stages (lite.pipeline) through plain numpy buffers, with no copy on the
    way in: a mixin for CPU runners."""

    def alloc_handoff(self, shape, dtype):
        return np.empty(shape, dtype)          # (T, n_embd)

    def to_handoff(self, y, buf):
        np.copyto(buf, y)

    def from_handoff(self, buf):
        return buf


class CPUBackend(HostHandoff, Ops):
    """Ops over NumPy float32 arrays for the tensors of one stage."""

    name = "cpu"
    xp = np
    device_key = "cpu"

    def __init__(self, gguf, names, tied_output=False, config=None):   # config: the GPU's settings
        from lite.progress import Progress
        self.gguf = gguf
        self.w = {}
        progress = Progress(sum(gguf.tensors[n].nbytes for n in names), "dequantizing weights")
        for n in names:
            progress.update(gguf.tensors[n].nbytes)
            if n == "token_embd.weight" or "_exps." in n:
                continue  # kept quantized: embed() and moe_experts() dequantize what they use
            self.w[n] = dequantize_tensor(gguf.tensors[n])
        progress.close()
        self.tied_output = tied_output
        self._out = None

    # --- ops -----------------------------------------------------------------------------------
    def embed(self, ids):                                   # -> (T, n_embd)
        t = self.gguf.tensors["token_embd.weight"]
        rows = t.raw.reshape(t.shape[0], -1)[np.asarray(ids, dtype=np.int64)]
        return gguf_quants.dequantize(rows, t.qtype).astype(np.float32, copy=False)

    def has(self, name):
        return name in self.w

    def linear(self, x, name):                              # (T, in) -> (T, out)
        y = x @ self.w[name].T
        bias = name[: -len("weight")] + "bias"
        if bias in self.w:
            y += self.w[bias]
        return y

    def linear_many(self, x, names):
        """Several products of the same input (q, k, v; gate, up)."""
        return [self.linear(x, n) for n in names]

    def rms_norm(self, x, name, eps):                       # normalizes the last axis
        ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
        return x * (1.0 / np.sqrt(ms + eps)) * self.w[name]

    def rope(self, x, pos0, base, neox, n_rot=None, freq_scale=1.0, freq_factors=None):
        """Rotary embedding of x (T, H, D) at positions pos0..pos0+T-1, over the first n_rot dims."""
        T, _, D = x.shape
        n_rot = n_rot or D
        half = n_rot // 2
        inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
        if freq_factors is not None:
            inv = inv / freq_factors[:half]
        ang = (np.arange(pos0, pos0 + T, dtype=np.float64) * freq_scale)[:, None] * inv[None, :]
        cos = np.cos(ang).astype(np.float32)[:, None, :]     # (T, 1, half)
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        out = x.copy()
        if neox:
            a, b = x[..., :half], x[..., half:n_rot]
            out[..., :half] = a * cos - b * sin
            out[..., half:n_rot] = a * sin + b * cos
        else:
            a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
            out[..., 0:n_rot:2] = a * cos - b * sin
            out[..., 1:n_rot:2] = a * sin + b * cos
        return out

    def attention(self, kv, il, q, k, v, pos0, scale, window=0):
        """Write k, v (T, Hkv, D) into the cache at pos0; attend q (T, H, D) causally -> (T, H*Dv)."""
        T, H, D = q.shape
        kv.write(il, k, v, pos0)
        K, V = kv.read(il, pos0 + T)                          # (Hkv, S, D), (Hkv, S, Dv)
        Hkv, S, Dv = V.shape
        G = H // Hkv
        qh = q.reshape(T, Hkv, G, D).transpose(1, 2, 0, 3)    # (Hkv, G, T, D)
        scores = (qh @ K[:, None].transpose(0, 1, 3, 2)) * np.float32(scale)   # (Hkv, G, T, S)
        qpos = np.arange(pos0, pos0 + T)[:, None]
        kpos = np.arange(S)[None, :]
        masked = kpos > qpos
        if window:
            masked |= (qpos - kpos) >= window
        scores = np.where(masked, np.float32(-np.inf), scores)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out = p @ V[:, None]                                  # (Hkv, G, T, Dv)
        return np.ascontiguousarray(out.transpose(2, 0, 1, 3)).reshape(T, H * Dv)

    def act_mul(self, gate, up, act):
        if act == "silu":
            return gate / (1.0 + np.exp(-gate)) * up
        if act == "gelu_tanh":
            c = np.float32(math.sqrt(2.0 / math.pi))
            return 0.5 * gate * (1.0 + np.tanh(c * (gate + np.float32(0.044715) * gate ** 3))) * up
        raise ValueError(f"unknown activation {act!r}")

    def moe_route(self, h, name, k, normalize):
        """Router softmax over all experts, top-k -> ids (T, k) int, weights (T, k) f32."""
        logits = h @ self.w[name].T                           # (T, n_expert)
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
        w = np.take_along_axis(p, ids, axis=-1)
        if normalize:
            w = w / w.sum(axis=-1, keepdims=True)
        return ids, w.astype(np.float32)

    def _expert(self, name, e):
        t = self.gguf.tensors[name]
        n_exp, rows, cols = t.shape
        per = t.nbytes // n_exp
        raw = t.raw[e * per:(e + 1) * per].reshape(rows, -1)
        return gguf_quants.dequantize(raw, t.qtype).astype(np.float32, copy=False)

    def moe_experts(self, h, il, ids, weights, act):
        """Sum over each token's chosen experts of weight * down(act(gate(h)) * up(h))."""
        p = f"blk.{il}."
        out = np.zeros_like(h)
        for e in np.unique(ids):
            rows, slot = np.nonzero(ids == e)
            x = h[rows]
            g = x @ self._expert(p + "ffn_gate_exps.weight", e).T
            u = x @ self._expert(p + "ffn_up_exps.weight", e).T
            y = self.act_mul(g, u, act) @ self._expert(p + "ffn_down_exps.weight", e).T
            np.add.at(out, rows, y * weights[rows, slot][:, None])
        return out

    def sigmoid_gate(self, x, h, name):
        """x (T, n) scaled row by row by sigmoid(h . w), w = name's vector (n_embd,): one gate a
        token (qwen2moe's shared expert)."""
        g = h @ self.w[name].reshape(-1)                      # (T,); some files store (1, n_embd)
        return x * (1.0 / (1.0 + np.exp(-g)))[:, None]

    # --- the hybrid's (qwen3next) ops -------------------------------------------------------------
    def sigmoid_mul(self, x, gate):
        """x * sigmoid(gate), elementwise (gated attention's output gate)."""
        return x * (1.0 / (1.0 + np.exp(-gate)))

    def l2_norm(self, x, eps):                              # over the last axis
        return x * (1.0 / np.sqrt(np.sum(np.square(x), axis=-1, keepdims=True) + np.float32(eps)))

    def concat(self, xs):                                   # along the last axis
        return np.concatenate(xs, axis=-1)

    def delta_gates(self, b, a, a_name, dt_bias_name):
        """beta = sigmoid(b); g = ssm_a * softplus(a + dt_bias), the log decay (<= 0). (T, Hv) each."""
        beta = 1.0 / (1.0 + np.exp(-b))
        g = self.w[a_name] * np.logaddexp(np.float32(0.0), a + self.w[dt_bias_name])
        return g.astype(np.float32), beta.astype(np.float32)

    def recurrent_state(self, kv, il, pos0, n_tokens):
        """The (conv, delta-rule) state of layer il that a chunk of n_tokens at pos0 updates in place."""
        return kv.recurrent.take(il, pos0, n_tokens)

    def conv_silu(self, x, name, state):
        """silu(causal conv of x (T, C)), the window before x in state (K-1, C), updated in place."""
        w = self.w[name]
        return causal_conv_silu(x, w.reshape(w.shape[0], -1), state)

    def delta_rule(self, q, k, v, g, beta, state, scale):
        """The gated delta rule over a chunk: the recurrence for one token (decode), the chunked
        form for more; state (Hv, dk, dv) updated in place. -> (T, Hv, dv)."""
        if q.shape[0] == 1:
            return delta_rule_recurrent(q, k, v, g, beta, state, scale)
        return delta_rule_chunked(q, k, v, g, beta, state, scale)

    def add(self, a, b):
        return a + b

    def scale(self, x, s):
        return x * np.float32(s)

    def output(self, x):                                      # (T, n_embd) -> (T, n_vocab) f32
        if "output.weight" in self.w:
            return x @ self.w["output.weight"].T
        if self._out is None:
            self._out = dequantize_tensor(self.gguf.tensors["token_embd.weight"])
        return x @ self._out.T

    def to_host(self, x):
        return x
