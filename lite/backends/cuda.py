"""The CUDA backend: CuPy for memory, streams and cuBLAS; CUDA C and Numba kernels for the
quantized weights.

Weights stay in VRAM as raw GGUF blocks. The matrix products are in cuda_linear.py (cuBLAS over an
fp16 dequantization in prefill, fused dequantize-and-dot kernels in decode), attention in
cuda_attention.py, experts in cuda_moe.py / cuda_host_experts.py / cuda_expert_dev.py, the stage
hand-off in cuda_handoff.py, the decode graph's pinned I/O in cuda_graph_io.py and the folded norms
in cuda_norm.py: mixins of (or helpers to) CUDABackend below.
Activations are float32. Everything of one stage is enqueued on that stage's stream; the host waits
only where data leaves the device (logits, hand-off).
"""
import contextlib
import logging
import os

import numpy as np

from lite.backend_config import BackendConfig
from lite.backends import cuda_graph_io
from lite.backends.cuda_attention import CUDAAttention
from lite.backends.cuda_handoff import CUDAHandoff
from lite.backends.cuda_linear import CUDALinear
from lite.backends.cuda_moe import CUDAExperts, _Weight
from lite.backends.cuda_norm import CUDAFoldNorm
from lite.kernels import matvec_cuda
from lite.kernels.matvec_epilogue import interleave_rows

log = logging.getLogger(__name__)

PINNED_STAGING_BYTES = 64 << 20
GATE_UP_INTERLEAVE = os.environ.get("LITE_GATE_UP_INTERLEAVE", "1") != "0"   # CUDABackend._interleave
IQ3_REGROUP = os.environ.get("LITE_IQ3_REGROUP", "1") != "0"   # CUDABackend._regroup_iq3
# IQ3_XXS matrices of whole bands of 16 rows as IQ3_XXS_B16 (kernels/matvec_mma.py's mvb / mvbe, prefill through
# kernels/dequant_b16.py) instead of IQ3_XXS_G4; LITE_IQ3_B16=0 keeps G4. Default since session 15 (H200, 8B
# IQ3_XXS tg128 after 512: 404-420 -> 495-505 tok/s; BENCHMARKS, session 15).
IQ3_B16 = os.environ.get("LITE_IQ3_B16", "1") != "0"


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


class CUDABackend(CUDALinear, CUDAFoldNorm, CUDAHandoff, CUDAAttention, CUDAExperts):
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
            self._plan_fusion(names)
            self._upload(names)
            # fp16 scratch for the largest quantized weight a prefill product dequantizes
            quantized = [w for w in self.w.values() if w.qtype not in ("F32", "F16")]
            quantized += [w for w, *_ in self.fused.values()]
            self._scratch = None
            self._scratch_elems = max((int(np.prod(w.shape)) for w in quantized), default=0)
            # The decode position lives on the device, so a captured graph replays any position.
            # Pinned graph I/O (BackendConfig.graph_io): [token, position] copied by the graph's
            # first node, pinned logits (lite/backends/cuda_graph_io.py); pos_dev is then a view
            # of its buffer.
            self.graph_io = (cuda_graph_io.DecodeIO(cp, cupyx, self.stream)
                             if self.config.graph_io else None)
            self.pos_dev = (self.graph_io.pos_dev if self.graph_io is not None
                            else cp.zeros(1, np.int64))
            self._pos_host = cupyx.empty_pinned(1, np.int64)
            self._norm_counter = cp.zeros(1, np.int32)     # cuda_norm.py's norm-out launches
            self._attn_counters = decode_attention.new_counters()   # its split merge
        self.capturing = False
        self._graph_memory = []   # allocations captured graphs refer to, kept alive with them

    # --- loading -------------------------------------------------------------------------------
    FUSE = (("attn_q.weight", "attn_k.weight", "attn_v.weight"), ("ffn_gate.weight", "ffn_up.weight"))

    def _plan_fusion(self, names):
        """Record the fusable groups (same quant type and row length, in GGUF blocks) that
        _upload stacks into one buffer: a decode step then runs one fused product for q, k and v,
        and one for gate and up, instead of five."""
        have = set(names)
        self._groups = []
        for n in names:
            for group in self.FUSE:
                if n.endswith("." + group[0]):
                    prefix = n[: -len(group[0])]
                    members = [prefix + g for g in group]
                    ts = [self.gguf.tensors[m] for m in members if m in have]
                    if (len(ts) == len(group) and len({t.qtype for t in ts}) == 1
                            and len({t.shape[-1] for t in ts}) == 1 and len(ts[0].shape) == 2
                            and ts[0].type_name not in ("F32", "F16")):
                        self._groups.append(members)

    def _upload(self, names):
        """Copy each tensor from the mapped file to the device through two pinned buffers."""
        import cupyx
        cp = self.cp
        from lite.progress import Progress
        progress = Progress(sum(self.gguf.tensors[n].nbytes for n in names),
                            f"loading weights to GPU {self.device.id}")
        staging = [cupyx.empty_pinned(PINNED_STAGING_BYTES, np.uint8) for _ in range(2)]
        events = [None, None]
        slot = 0
        for n in names:
            t = self.gguf.tensors[n]
            if t.type_name == "F32":
                data = cp.empty(t.shape, np.float32)
            elif t.type_name == "F16" and len(t.shape) <= 2:
                data = cp.empty(t.shape, np.float16)
            else:
                data = cp.empty(t.nbytes, np.uint8)
            dst = data.view(np.uint8).reshape(-1)
            for off in range(0, t.nbytes, PINNED_STAGING_BYTES):
                n_b = min(PINNED_STAGING_BYTES, t.nbytes - off)
                if events[slot] is not None:
                    events[slot].synchronize()         # the copy out of this buffer is done
                np.copyto(staging[slot][:n_b], t.raw[off:off + n_b])
                dst[off:off + n_b].set(staging[slot][:n_b], stream=self.stream)
                events[slot] = self.stream.record()
                slot ^= 1
                progress.update(n_b)
            self.w[n] = _Weight(n, t.type_name, t.shape, data)
        self.stream.synchronize()
        progress.close()
        cp = self.cp
        for members in self._groups:
            ws = [self.w[m] for m in members]
            buf = cp.concatenate([w.data for w in ws])          # rows stacked: one weight
            rows = [w.shape[0] for w in ws]
            interleaved = self._interleave(ws)
            if interleaved:      # gate/up rows alternating: a gated decode CTA reads one contiguous range
                F = rows[0]
                buf = buf.reshape(2 * F, -1)[cp.asarray(interleave_rows(F))].reshape(-1)
                for m in members:                                # only the group is ever used
                    del self.w[m]
            else:
                off = 0
                for w in ws:                                     # members become views of it
                    w.data = buf[off:off + w.data.size]
                    off += w.data.size
            self.fused[tuple(members)] = (_Weight("+".join(members), ws[0].qtype,
                                                  (sum(rows), ws[0].shape[1]), buf), rows, interleaved)
        self._regroup_iq3()

    def _regroup_iq3(self):
        """IQ3_XXS matrices regrouped for the decode products (kernels/iq3_groups.py: 4096x14336 16.9
        -> 13.8 us on the H200, 4% more bytes), named IQ3_XXS_G4; LITE_IQ3_REGROUP=0 keeps the file's
        layout. Rows stay contiguous, so a fused group's members are views of its new buffer (nbytes apart).
        By default (LITE_IQ3_B16=0: G4 everywhere) matrices of whole bands of 16 rows as IQ3_XXS_B16 instead
        (kernels/iq3_b16.py; decode through kernels/matvec_mma.py, the epilogues through matvec_epilogue's
        delegation, prefill through dequant_b16), token_embd kept in G4 (its rows are looked up)."""
        from lite.kernels import iq3_b16, iq3_groups
        if not (IQ3_REGROUP and iq3_groups.applies()):
            return

        def layout(name, w):        # the module that repacks w, or None (token_embd: looked up by rows in G4)
            if not iq3_groups.regroupable(w.qtype, w.shape):
                return None
            if IQ3_B16 and name != "token_embd.weight" and iq3_b16.fits(*w.shape):
                return iq3_b16
            return iq3_groups
        in_groups = set()
        for members, (gw, _, interleaved) in self.fused.items():
            in_groups.update(members)
            mod = layout("+".join(members), gw)
            if mod is iq3_b16 and any(not iq3_b16.fits(*self.w[m].shape) for m in members if m in self.w):
                mod = iq3_groups                             # a member's byte range would cut a band
            if mod is None:
                continue
            gw.data, gw.qtype, off = mod.repack(gw.data, *gw.shape), mod.NAME, 0
            for m in members if not interleaved else ():     # (interleaved: the members are gone)
                w = self.w[m]                                # B16: whole bands, so a member is a byte range
                size = mod.nbytes(*w.shape)
                w.data, w.qtype = gw.data[off:off + size], mod.NAME
                off += size
        for n, w in self.w.items():
            mod = None if n in in_groups else layout(n, w)
            if mod is not None:
                w.data, w.qtype = mod.repack(w.data, *w.shape), mod.NAME

    def _interleave(self, ws):
        """Store [gate; up] rows alternating (kernels/matvec_epilogue.interleave_rows)?
        For the gated decode kernel's types: measured on the H200 (session 4, 2 x 14336 x 4096) the
        gated product takes 30.2 instead of 33.5 us (Q4_K), 39.1 instead of 40.5 (Q6_K), when a
        CTA's gate and up rows are neighbours rather than 33 MB apart (measured with rows in pairs,
        gate u, u+1, up u, u+1; alternating rows keep a CTA's rows contiguous the same way and let
        prefill split the product by strided views). LITE_GATE_UP_INTERLEAVE=0: halves. IQ3_XXS too
        where its products run on mvq (session 9: the gated epilogue on its structs)."""
        from lite.kernels import matvec_q8
        return (len(ws) == 2 and ws[0].name.endswith("ffn_gate.weight") and GATE_UP_INTERLEAVE
                and (ws[0].qtype in matvec_cuda.CONFIG or (ws[0].qtype == "IQ3_XXS" and matvec_q8.applies("IQ3_XXS"))))

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
        last = "output_norm.weight" in self.w
        for n, w in self.w.items():
            if len(w.shape) != 2 or w.qtype == "F32":
                continue
            if n == "token_embd.weight" and (not last or "output.weight" in self.w):
                continue          # only looked up by rows here, never multiplied
            if get_matvec(w.qtype) is None:
                return False
        return True

    def persistent_input(self, x):
        """A device buffer that keeps its address, for a graph's input (token ids or hidden)."""
        cp = self.cp
        if isinstance(x, cp.ndarray):
            return x.copy()
        io = getattr(self, "graph_io", None)
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
        return dequantize(rows, w.qtype, np.float32, self.stream).reshape(len(ids), n_embd)

    def rms_norm(self, x, name, eps):
        later = self._norm_out(x, name, eps)    # split across the products (cuda_norm.py)
        if later is not None:
            return later
        x = self._arr(x)
        if x.ndim == 3 and x.shape[0] == 1 and self.fold_qk_norm:   # a decode token's q or k heads:
            return self._norm_later(x, name, eps)                   # normed in rope_kv_store
        return self.small_ops.rms_norm(self.cp.ascontiguousarray(x), self.w[name].data, eps,
                                       self.stream)

    def add_rms_norm(self, x, y, name, eps):
        """(x + y, rms_norm(x + y)): the residual add and the next norm in one launch."""
        cp, x, y = self.cp, self._arr(x), self._arr(y)
        return self.small_ops.add_rms_norm(cp.ascontiguousarray(x), cp.ascontiguousarray(y),
                                           self.w[name].data, eps, self.stream)

    def act_mul(self, gate, up, act):
        gate, up = self._arr(gate), self._arr(up)
        if act == "silu":
            return self.small_ops.silu_mul(gate, up)
        if act == "gelu_tanh":
            return self.small_ops.gelu_tanh_mul(gate, up)
        raise ValueError(f"unknown activation {act!r}")

    def sigmoid_gate(self, x, h, name):
        """x (T, n) scaled row by row by sigmoid(h . w), w an F32 vector (n_embd,); CuPy ops on the
        current stream (qwen2moe's shared expert; MoE stages do not capture graphs)."""
        w, x, h = self.w[name], self._arr(x), self._arr(h)
        if w.qtype != "F32":
            raise NotImplementedError(f"{name}: a {w.qtype} gate vector on the GPU (F32 is)")
        g = h @ w.data.reshape(-1)                            # (T,); some files store (1, n_embd)
        return x * (1.0 / (1.0 + self.cp.exp(-g)))[:, None]

    def add(self, a, b):
        return self._arr(a) + self._arr(b)

    def scale(self, x, s):
        return self._arr(x) * np.float32(s)

    # --- host transfers (the stage hand-off is in lite/backends/cuda_handoff.py) ---------------
    def to_host(self, x):
        x = self._arr(x)
        io = getattr(self, "graph_io", None)
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

