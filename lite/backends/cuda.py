"""The CUDA backend: CuPy for memory, streams and cuBLAS; CUDA C and Numba kernels for the
quantized weights.

Weights stay in VRAM as raw GGUF blocks. The matrix products are in cuda_linear.py (cuBLAS over an
fp16 dequantization in prefill, fused dequantize-and-dot kernels in decode), attention in
cuda_attention.py, experts in cuda_moe.py / cuda_host_experts.py / cuda_expert_dev.py, the stage
hand-off in cuda_handoff.py, the decode graph's pinned I/O in cuda_graph_io.py, the folded norms
in cuda_norm.py and the weights' upload and GPU layouts in cuda_weights.py: mixins of (or helpers
to) CUDABackend below, which implements the ops interface (lite/backends/ops.py Ops, last in its
bases, so every part overrides its defaults). What the parts give each other is public and named
here (a test of the tree fails on one part calling another's private method):
  CUDAWeights    plan_fusion, upload_weights(names, fuse)
  CUDALinear     matmul, epilogue_launch, kernel_options, records_for, supports_epilogue
  CUDAFoldNorm   as_array, materialized, folded_product, takes_scaled, add_later, norm_out_launch
  CUDAAttention  norm_later, norm_now
  CUDABackend    attn_counters, norm_counter, scratch_elems (made in __init__)
Activations are float32. Everything of one stage is enqueued on that stage's stream; the host waits
only where data leaves the device (logits, hand-off).
"""
import contextlib
import logging

import numpy as np

from lite.backend_config import BackendConfig
from lite.backends import cuda_graph_io
from lite.backends.cuda_attention import CUDAAttention, CUDARecurrent
from lite.backends.cuda_handoff import CUDAHandoff
from lite.backends.cuda_linear import CUDALinear
from lite.backends.cuda_moe import CUDAExperts
from lite.backends.cuda_norm import CUDAFoldNorm
from lite.backends.ops import Ops
from lite.backends.cuda_weights import CUDAWeights

log = logging.getLogger(__name__)



def unavailable_reason():
    """None when lite can run on a GPU here, else why not (one line)."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'lite[cuda12]' or 'lite[cuda13]')"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device found"
    except Exception as e:  # no driver, or a driver too old for this CuPy
        return f"no usable CUDA driver ({str(e).splitlines()[0]})"
    from lite.kernels.util import SIMULATOR
    if SIMULATOR:
        return "NUMBA_ENABLE_CUDASIM=1 is set (kernels would run in the simulator)"
    return None


class CUDABackend(CUDAWeights, CUDALinear, CUDAFoldNorm, CUDAHandoff, CUDAAttention, CUDAExperts, CUDARecurrent,
                  Ops):
    name = "cuda"
    supports_graphs = True

    def __init__(self, gguf, names, device_id=0, config=None):
        import cupy as cp
        import cupyx
        from lite.kernels import decode_attention, small_ops
        self.config = config if config is not None else BackendConfig()
        from lite.kernels import pdl
        with cp.cuda.Device(device_id):
            self.pdl = pdl.resolve(self.config.pdl)     # every decode wrapper takes it as pdl=
        self.cp = self.xp = cp
        self.small_ops = small_ops
        self.decode_attn = decode_attention
        self.gguf = gguf
        self.device = cp.cuda.Device(device_id)
        self.device_key = f"cuda:{device_id}"
        with self.device:
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.w = {}
            self.fused = {}       # (names...) -> (_Weight of the rows stacked, row counts, interleaved?)
            self.plan_fusion(names)
            self.upload_weights(names)
            # fp16 scratch for the largest quantized weight a prefill product dequantizes
            quantized = [w for w in self.w.values() if w.qtype not in ("F32", "F16")]
            quantized += [w for w, *_ in self.fused.values()]
            self._scratch = None
            self.scratch_elems = max((int(np.prod(w.shape)) for w in quantized), default=0)
            # The decode position lives on the device, so a captured graph replays any position.
            # Pinned graph I/O (BackendConfig.graph_io): [token, position] copied by the graph's
            # first node, pinned logits (lite/backends/cuda_graph_io.py); pos_dev is then a view
            # of its buffer.
            self.graph_io = (cuda_graph_io.DecodeIO(cp, cupyx, self.stream)
                             if self.config.graph_io else None)
            self.pos_dev = (self.graph_io.pos_dev if self.graph_io is not None
                            else cp.zeros(1, np.int64))
            self._pos_host = cupyx.empty_pinned(1, np.int64)
            self.norm_counter = cp.zeros(1, np.int32)     # cuda_norm.py's norm-out launches
            self.attn_counters = decode_attention.new_counters()   # its split merge
        self.capturing = False
        self._graph_memory = []   # allocations captured graphs refer to, kept alive with them

    def activate(self):
        """Enter this backend's device and stream (CuPy ops then run on the stream)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.device)
        stack.enter_context(self.stream)
        return stack

    def begin(self, pos0, n_tokens):
        """Called before a forward: a one-token step reads its position from pos_dev."""
        if n_tokens == 1 and not self.capturing:
            self._pos_host[0] = pos0
            self.pos_dev.set(self._pos_host, stream=self.stream)

    # --- CUDA graphs for decode --------------------------------------------------------------
    def graph_safe(self):
        """Can a decode step be captured? CuPy refuses cuBLAS calls during capture, so every
        matrix a token multiplies must have a fused matvec kernel (F32 norms and router aside)."""
        from lite.kernels import get_matvec
        return all(get_matvec(w.qtype) is not None for w in self.multiplied_weights())

    def multiplied_weights(self):
        """The matrices a token is multiplied with (F32 norms and router aside; experts: cuda_moe.py): the
        fused groups too (an interleaved [gate; up] pair's members are gone from self.w)."""
        yield from (w for w, *_ in self.fused.values())
        last = "output_norm.weight" in self.w
        for n, w in self.w.items():
            if len(w.shape) != 2 or w.qtype == "F32":
                continue
            if n == "token_embd.weight" and (not last or "output.weight" in self.w):
                continue          # only looked up by rows here, never multiplied
            yield w

    def persistent_input(self, x):
        """A device buffer that keeps its address, for a graph's input (token ids or hidden)."""
        cp = self.cp
        if isinstance(x, cp.ndarray):
            return x.copy()
        io = self.graph_io
        if io is not None:
            return io.input_ids(x)      # the graph copies each step's token into it
        return cp.asarray(np.asarray(x, dtype=np.int64))

    def set_input(self, buf, x):
        if isinstance(x, self.cp.ndarray):
            buf[...] = x
        else:
            buf.set(np.asarray(x, dtype=buf.dtype), stream=self.stream)

    def capture(self, fn):
        """Capture fn()'s work on this stream into a graph. Every allocation made while capturing
        is kept alive with the graph (its kernels have those addresses baked in)."""
        cp = self.cp
        pool = cp.get_default_memory_pool()
        keep = []

        def alloc(size):
            mem = pool.malloc(size)
            keep.append(mem)
            return mem

        self.capturing = True
        try:
            with cuda_graph_io.no_collection(), cp.cuda.using_allocator(alloc):
                self.stream.begin_capture()
                try:
                    out = fn()
                finally:
                    graph = self.stream.end_capture()
        finally:
            self.capturing = False
        self._graph_memory.append(keep)
        return graph, out

    def replay(self, graph):
        graph.launch(self.stream)

    # --- ops -----------------------------------------------------------------------------------
    def has(self, name):
        return name in self.w

    def embed(self, ids):                                   # -> (T, n_embd) f32
        from lite.kernels import dequantize
        cp = self.cp
        w = self.w["token_embd.weight"]
        n_vocab, n_embd = w.shape
        ids_d = ids if isinstance(ids, cp.ndarray) else cp.asarray(np.asarray(ids, dtype=np.int64))
        if w.qtype in ("F32", "F16"):
            return w.data[ids_d].astype(np.float32)
        rows = w.data.reshape(n_vocab, -1)[ids_d].reshape(-1)
        return dequantize(rows, w.qtype, np.float32, self.stream,
                          reference=self.config.reference_kernels).reshape(len(ids), n_embd)

    def rms_norm(self, x, name, eps):
        later = self.norm_out_launch(x, name, eps)    # split across the products (cuda_norm.py)
        if later is not None:
            return later
        x = self.as_array(x)
        if x.ndim == 3 and x.shape[0] == 1 and self.fold_qk_norm:   # a decode token's q or k heads:
            return self.norm_later(x, name, eps)                   # normed in rope_kv_store
        return self.small_ops.rms_norm(self.cp.ascontiguousarray(x), self.w[name].data, eps,
                                       self.stream)

    def add_rms_norm(self, x, y, name, eps):
        """(x + y, rms_norm(x + y)): the residual add and the next norm in one launch."""
        cp, x, y = self.cp, self.as_array(x), self.as_array(y)
        return self.small_ops.add_rms_norm(cp.ascontiguousarray(x), cp.ascontiguousarray(y),
                                           self.w[name].data, eps, self.stream)

    def act_mul(self, gate, up, act):
        gate, up = self.as_array(gate), self.as_array(up)
        if act == "silu":
            return self.small_ops.silu_mul(gate, up)
        if act == "gelu_tanh":
            return self.small_ops.gelu_tanh_mul(gate, up)
        raise ValueError(f"unknown activation {act!r}")

    def sigmoid_gate(self, x, h, name):
        """x (T, n) scaled row by row by sigmoid(h . w), w an F32 vector (n_embd,); CuPy ops on the
        current stream (qwen2moe's shared expert; MoE stages do not capture graphs)."""
        w, x, h = self.w[name], self.as_array(x), self.as_array(h)
        if w.qtype != "F32":
            raise NotImplementedError(f"{name}: a {w.qtype} gate vector on the GPU (F32 is)")
        g = h @ w.data.reshape(-1)                            # (T,); some files store (1, n_embd)
        return x * (1.0 / (1.0 + self.cp.exp(-g)))[:, None]

    def add(self, a, b):
        return self.as_array(a) + self.as_array(b)

    def scale(self, x, s):
        return self.as_array(x) * np.float32(s)

    # --- host transfers (the stage hand-off is in lite/backends/cuda_handoff.py) ---------------
    def to_host(self, x):
        x = self.as_array(x)
        io = self.graph_io
        if io is not None:
            out = io.to_host(x)                    # (1, n) logits: through pinned memory
            if out is not None:
                return out
        out = self.cp.asnumpy(x, stream=self.stream)
        self.stream.synchronize()
        return out

    def synchronize(self):
        self.stream.synchronize()
        self.synchronize_handoff()

