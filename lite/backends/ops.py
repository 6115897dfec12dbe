"""The ops interface: every op and capability that models/, the stage and the batched step call on a
backend, with the defaults a backend inherits unless it overrides them.

The CPU backend (cpu.py), the CUDA backend (cuda.py) and the batched step's ops (lite/engine/paged_kv.py
BatchOps, lite/engine/paged_cuda.py CUDABatchOps) derive from Ops, so callers never ask an ops object what
it has: a fused op (linear_add, linear_gated, add_rms_norm) is composed here from the plain ones
unless a backend fuses it, and each capability is a plain attribute or method with its default.

An op may return a value that stands for an array not computed yet (the CUDA backend's deferred
adds, norms and rotations, lite/backends/cuda_norm.py and cuda_attention.py); only the ops of the
same backend take such values, and done() / norm_now() turn them back into arrays.
"""
import contextlib


class Ops:
    name = "ops"                  # the backend's name: "cpu", "cuda"
    xp = None                     # the array module of its arrays (numpy, cupy)
    device_key = None             # stages with the same key share a device ("cpu", "cuda:0")
    device = None                 # the CuPy device of a GPU backend
    stream = None                 # the stream a GPU backend enqueues on (None: none)
    graph_io = None               # a GPU backend's pinned decode-graph I/O (cuda_graph_io.DecodeIO)
    supports_graphs = False       # a decode step may be captured and replayed (capture, replay)
    supports_host_experts = False  # MoE experts may stay off the device (place_experts)
    moe_residual = False          # moe_experts(residual=) adds the residual inside its combine
    fused_delta_step = False      # one decode token of a recurrent layer is delta_step (one launch)

    # --- the ops every backend implements ------------------------------------------------------
    def _missing(self, op):
        return NotImplementedError(f"the {self.name} backend has no {op}")

    def embed(self, ids):                                    # token ids (T,) -> (T, n_embd)
        raise self._missing("embed")

    def has(self, name):                                     # is this tensor among the stage's?
        raise self._missing("has")

    def linear(self, x, name):                               # (T, in) @ W.T (+ bias) -> (T, out)
        raise self._missing("linear")

    def rms_norm(self, x, name, eps):                        # over the last axis, times the weight
        raise self._missing("rms_norm")

    def rope(self, x, pos0, base, neox, n_rot=None, freq_scale=1.0, freq_factors=None):
        raise self._missing("rope")

    def attention(self, kv, il, q, k, v, pos0, scale, window=0):
        raise self._missing("attention")

    def attend(self, q, K, V, pos0, scale, window=0):        # attention's part after the KV write
        raise self._missing("attend")

    def paged_flash_takes(self, D, Dv):        # a flash kernel over the server's pages for these dims?
        return False

    def act_mul(self, gate, up, act):                        # act(gate) * up
        raise self._missing("act_mul")

    def add(self, a, b):
        raise self._missing("add")

    def scale(self, x, s):
        raise self._missing("scale")

    def output(self, x):                                     # (T, n_embd) -> logits (T, n_vocab)
        raise self._missing("output")

    def to_host(self, x):                                    # -> a numpy array
        raise self._missing("to_host")

    def moe_route(self, h, name, k, normalize):              # -> expert ids (T, k), weights (T, k)
        raise self._missing("moe_route")

    def moe_experts(self, h, il, ids, weights, act, residual=None):
        raise self._missing("moe_experts")

    def sigmoid_gate(self, x, h, name):                      # x scaled per row by sigmoid(h . w)
        raise self._missing("sigmoid_gate")

    # --- fused ops: composed of the plain ones unless a backend fuses them ----------------------
    def linear_many(self, x, names):
        """Several products of the same input (q, k, v; gate, up)."""
        return [self.linear(x, n) for n in names]

    def linear_add(self, x, name, res):
        """res + x @ W.T."""
        return self.add(res, self.linear(x, name))

    def linear_gated(self, x, names, act):
        """act(x @ gate.T) * (x @ up.T), names = [gate, up]."""
        gate, up = self.linear_many(x, names)
        return self.act_mul(gate, up, act)

    def add_rms_norm(self, x, y, name, eps):
        """(x + y, rms_norm(x + y))."""
        s = self.add(x, y)
        return s, self.rms_norm(s, name, eps)

    @property
    def folds_residuals(self):
        """Does a decode token fold its residual adds into the products (linear_add)? Where the
        backend fuses linear_add (overrides it): there the add costs no launch of its own."""
        return type(self).linear_add is not Ops.linear_add

    def done(self, x):
        """A stage's output as an array (a backend's last residual add may be deferred)."""
        return x

    def norm_now(self, x):
        """x as an array where rms_norm left a per-head norm for attention (CUDA's NormLater)."""
        return x

    def add_sigmoid_gated(self, base, x, h, name):
        """base + sigmoid_gate(x, h, name): a shared expert's output added to the experts'."""
        return self.add(base, self.sigmoid_gate(x, h, name))

    @property
    def row_invariant(self):
        """These ops with a row's result independent of the rows beside it (the server's batched
        step takes them): the ops themselves where they already are (the CPU backend pads)."""
        return self

    # --- the hybrid's (qwen3next) ops: a backend that runs it implements all of them ------------
    def sigmoid_mul(self, x, gate):
        raise self._missing("sigmoid_mul")

    def l2_norm(self, x, eps):
        raise self._missing("l2_norm")

    def concat(self, xs):
        raise self._missing("concat")

    def delta_gates(self, b, a, a_name, dt_bias_name):
        raise self._missing("delta_gates")

    def recurrent_state(self, kv, il, pos0, n_tokens):
        raise self._missing("recurrent_state")

    def conv_silu(self, x, name, state):
        raise self._missing("conv_silu")

    def delta_rule(self, q, k, v, g, beta, state, scale):
        raise self._missing("delta_rule")

    def delta_step(self, qkv, ba, names, conv_state, ssm_state, eps, scale):   # fused_delta_step
        raise self._missing("delta_step")

    @classmethod
    def lacks(cls, ops):
        """The ops of `ops` (names) this backend leaves to the stubs above."""
        return [op for op in ops if getattr(cls, op) is getattr(Ops, op)]

    # --- device, hand-off, experts and graphs: what the stage calls ------------------------------
    def activate(self):
        """A context in which this backend's work runs (a GPU's device and stream)."""
        return contextlib.nullcontext()

    def begin(self, pos0, n_tokens):
        """Called before a forward of n_tokens at pos0."""

    def synchronize(self):
        """Wait for the work enqueued so far."""

    def alloc_handoff(self, shape, dtype):
        raise self._missing("alloc_handoff")

    def to_handoff(self, y, buf):
        raise self._missing("to_handoff")

    def from_handoff(self, buf):
        raise self._missing("from_handoff")

    def configure_handoff(self, mode="host", copy_stream=False):
        raise self._missing(f"--handoff {mode}" + (" --handoff-stream" if copy_stream else ""))

    def place_experts(self, gguf, names, experts="auto", expert_cache="auto"):
        raise self._missing("place_experts")                # only where supports_host_experts

    def expert_stats(self):
        """The expert cache's counters, or None (experts on the device, or no cache)."""
        return None

    def graph_safe(self):
        """Can a decode step of this stage be captured (with supports_graphs)?"""
        return False

    def moe_graph_safe(self):
        """Can a decode step of this MoE stage be captured?"""
        return False

    def persistent_input(self, x):
        raise self._missing("persistent_input")

    def set_input(self, buf, x):
        raise self._missing("set_input")

    def capture(self, fn):
        raise self._missing("capture")

    def replay(self, graph):
        raise self._missing("replay")
