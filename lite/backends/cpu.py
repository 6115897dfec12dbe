"""The CPU backend: NumPy, float32. The reference every GPU result is checked against.

Weights are dequantized to float32 when a stage loads them (gguf.quants does the block arithmetic),
except the token embedding, which stays in its GGUF blocks and is dequantized a row at a time on
lookup; when the output projection is tied to it, the full table is dequantized once, on first use.

The server's batched step takes the backend's row_invariant view: BLAS sums a product of one row
(gemv) or of a small one (OpenBLAS's small-matrix kernels) in another order than its blocked gemm,
whose order for an output is fixed by the inputs alone, so the view pads every product with zero
rows past those kernels (invariant_rows probes how far, once per shape) and a row's result is the same bytes whichever rows share its step; its
attention takes a prompt chunk row by row, as decode does, so a row's bytes do not depend on where
its chunk starts (a prompt served partly from the prefix cache gives its uncached logits).
"""
import copy
import logging
import math
import os
from pathlib import Path

import numpy as np
from gguf import quants as gguf_quants

from lite.backends.cpu_recurrent import causal_conv_silu, delta_rule_chunked, delta_rule_recurrent
from lite.backends.ops import Ops
from lite.errors import UnsupportedQuantError

log = logging.getLogger(__name__)

# past these many rows, rows x outputs and rows x outputs x inputs a product is surely past
# OpenBLAS's gemv and small-matrix kernels (tests/test_batch_invariance.py checks the BLAS)
INVARIANT_ROWS, INVARIANT_OUTPUTS, INVARIANT_MACS = 8, 4096, 1 << 21
_pad_rows = {}                          # (outputs, inputs) -> rows, probed once per shape


def invariant_rows(n_out, n_in):
    """The fewest rows a product of this shape pads to so that each row gets the bytes it gets in
    any larger product: probed once on the installed BLAS, every row count up to the bound above
    against the bound's product (a lone row padded to the bound costs gemm's work many times over)."""
    key = (n_out, n_in)
    if key not in _pad_rows:
        bound = max(INVARIANT_ROWS, -(-INVARIANT_OUTPUTS // n_out), -(-INVARIANT_MACS // (n_out * n_in)))
        rng = np.random.default_rng(0)
        w = rng.random(key, np.float32) - np.float32(0.5)
        x = rng.random((bound, n_in), np.float32) - np.float32(0.5)
        ref, rows = x @ w.T, bound
        while rows > 1 and (x[:rows - 1] @ w.T).tobytes() == ref[:rows - 1].tobytes():
            rows -= 1
        _pad_rows[key] = rows
    return _pad_rows[key]


_threads_chosen = [False]        # whether -t (or the default below) has set the BLAS threads


def set_threads(n):
    """Limit the threads of NumPy's BLAS (the CPU backend's matrix products) for this process."""
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=int(n), user_api="blas")
    _threads_chosen[0] = True


def physical_cores(cpus=None, siblings=None):
    """The physical cores this process may run on: its CPU affinity, with SMT siblings counted once
    (siblings(cpu): the text of /sys/devices/system/cpu/cpuN/topology/thread_siblings_list; a CPU
    whose list cannot be read counts as a core of its own)."""
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    siblings = siblings or (lambda cpu: Path(
        f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text())
    cores = set()
    for cpu in cpus:
        try:
            cores.add(frozenset(_cpu_list(siblings(cpu))))
        except (OSError, ValueError):
            cores.add(frozenset([cpu]))
    return max(1, len(cores))


def _cpu_list(text):
    """The CPUs of a Linux cpu list: "0-3,8,10-11"."""
    out = set()
    for item in text.strip().split(","):
        lo, _, hi = item.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


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
    """Hand-off between stages (lite.chain.pipeline) through plain numpy buffers, with no copy on the
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
    pad_rows = False                    # the row_invariant view's products pad their rows
    _invariant = None

    def __init__(self, gguf, names, tied_output=False, config=None):   # config: the GPU's settings
        from lite.progress import Progress
        if not _threads_chosen[0]:   # BLAS's own default, every logical CPU, oversubscribes SMT and shared machines
            set_threads(physical_cores())
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
        self._tied = {}                 # the tied output table, once dequantized (the view shares it)

    @property
    def row_invariant(self):
        """These ops (the same weights) with every product padded past BLAS's small kernels."""
        if self._invariant is None:
            self._invariant = copy.copy(self)
            self._invariant.pad_rows = True
        return self._invariant

    def product(self, x, w):
        """x (T, in) @ w (out, in).T; in the row_invariant view, over zero rows added past BLAS's
        small kernels so each row's result does not depend on T."""
        T, (n_out, n_in) = x.shape[0], w.shape
        if not self.pad_rows:
            return x @ w.T
        rows = max(T, invariant_rows(n_out, n_in))
        if rows == T:
            return x @ w.T
        padded = np.zeros((rows, n_in), np.float32)
        padded[:T] = x
        return (padded @ w.T)[:T]

    # --- ops -----------------------------------------------------------------------------------
    def embed(self, ids):                                   # -> (T, n_embd)
        t = self.gguf.tensors["token_embd.weight"]
        rows = t.raw.reshape(t.shape[0], -1)[np.asarray(ids, dtype=np.int64)]
        return gguf_quants.dequantize(rows, t.qtype).astype(np.float32, copy=False)

    def has(self, name):
        return name in self.w

    def linear(self, x, name):                              # (T, in) -> (T, out)
        y = self.product(x, self.w[name])
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
        T = q.shape[0]
        kv.write(il, k, v, pos0)
        return self.attend(q, *kv.read(il, pos0 + T), pos0, scale, window)   # (Hkv, S, D), (Hkv, S, Dv)

    def attend(self, q, K, V, pos0, scale, window=0):
        """q (T, H, D) at positions pos0.. causally over the first pos0 + T positions of K, V."""
        T = q.shape[0]
        K, V = (a[:, :pos0 + T].astype(np.float32, copy=False) for a in (K, V))
        if not self.pad_rows or T == 1:
            return self._attend(q, K, V, pos0, scale, window)
        # the row_invariant view: a row over its own keys alone, the shapes of its products and
        # softmax those of a decode row at its position, so its bytes do not depend on the chunk
        return np.concatenate([self._attend(q[i:i + 1], K[:, :pos0 + i + 1], V[:, :pos0 + i + 1],
                                            pos0 + i, scale, window) for i in range(T)])

    @staticmethod
    def _attend(q, K, V, pos0, scale, window):
        """q (T, H, D) at positions pos0.. over keys K (Hkv, S, D), values V (Hkv, S, Dv) -> (T, H*Dv)."""
        T, H, D = q.shape
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
        logits = self.product(h, self.w[name])                # (T, n_expert)
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
            g = self.product(x, self._expert(p + "ffn_gate_exps.weight", e))
            u = self.product(x, self._expert(p + "ffn_up_exps.weight", e))
            y = self.product(self.act_mul(g, u, act), self._expert(p + "ffn_down_exps.weight", e))
            np.add.at(out, rows, y * weights[rows, slot][:, None])
        return out

    def sigmoid_gate(self, x, h, name):
        """x (T, n) scaled row by row by sigmoid(h . w), w = name's vector (n_embd,): one gate a
        token (qwen2moe's shared expert)."""
        w = self.w[name].reshape(-1)                          # some files store (1, n_embd)
        # a row's sum alone (numpy reduces each row by itself), not gemv's: the same in any batch
        g = np.sum(h * w, axis=-1) if self.pad_rows else h @ w
        return x * (1.0 / (1.0 + np.exp(-g)))[:, None]

    def add_sigmoid_gated(self, base, x, h, name):
        """base + sigmoid_gate(x, h, name): the shared expert's output added to the experts'."""
        return base + self.sigmoid_gate(x, h, name)

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
            return self.product(x, self.w["output.weight"])
        if not self._tied:
            self._tied["output"] = dequantize_tensor(self.gguf.tensors["token_embd.weight"])
        return self.product(x, self._tied["output"])

    def to_host(self, x):
        return x
