"""A stage: one contiguous range of layers on one backend, with the KV cache of those layers.

The first stage also embeds tokens; the last also applies the final norm and the output
projection. With one stage this is the whole model.
"""
import contextlib
from dataclasses import dataclass

import numpy as np

from lite.engine.paged_cuda import batch_ops
from lite.errors import DeviceError, LiteError
from lite.engine.kv_cache import KVCache, kv_bytes_per_token
from lite.models import family
from lite.chain.pipeline import StepJob, StreamTimer


@dataclass
class StageSpec:
    layers: range
    first: bool
    last: bool


def split_layers(n_layer, split):
    """Layer ranges from a split spec: None/'auto'/1 -> one stage; an int S -> S near-equal stages;
    a list of counts -> those counts (must add up to n_layer)."""
    if split in (None, "auto"):
        counts = [n_layer]
    elif isinstance(split, int):
        if not 1 <= split <= n_layer:
            raise LiteError(f"cannot split {n_layer} layers into {split} stages")
        counts = [n_layer // split + (i < n_layer % split) for i in range(split)]
    else:
        counts = [int(c) for c in split]
        if any(c <= 0 for c in counts) or sum(counts) != n_layer:
            raise LiteError(f"--layer-split {','.join(map(str, counts))} must be positive counts "
                             f"adding up to the model's {n_layer} layers")
    specs, start = [], 0
    for i, c in enumerate(counts):
        specs.append(StageSpec(range(start, start + c), i == 0, i == len(counts) - 1))
        start += c
    return specs


def stage_tensor_names(gguf, cfg, spec):
    names = [n for n in gguf.tensors
             if n.startswith("blk.") and int(n.split(".")[1]) in spec.layers]
    if spec.first or spec.last:
        names.append("token_embd.weight")
    if spec.last:
        names += [n for n in ("output_norm.weight", "output.weight", "rope_freqs.weight")
                  if n in gguf.tensors]
    return names


class Stage:
    """A layer range on one backend; also the StageRunner the stage chain drives (lite.chain.pipeline):
    run() computes one job (a request's chunk or decode step, a server step's rows), and the
    hand-off buffers come from the backend (pinned on a GPU)."""

    def __init__(self, gguf, cfg, spec, backend_cls, max_context, kv_kind, device_id=None,
                 experts="auto", expert_cache="auto", handoff="host", handoff_stream=False,
                 config=None, contiguous_kv=True):
        self.cfg, self.spec = cfg, spec
        fam = family(cfg.arch)
        self.fwd = fam.forward_layer
        if hasattr(fam, "check_tensors"):          # one line naming a missing or misshaped tensor
            fam.check_tensors(gguf, cfg, spec.layers)
            fam.check_backend(backend_cls)
        names = stage_tensor_names(gguf, cfg, spec)
        # --experts: a backend that can keep experts off the device places them itself, after the
        # dense weights and the KV cache (so that auto sees what VRAM is left).
        exps = ([n for n in names if n.endswith("_exps.weight")]
                if cfg.is_moe and backend_cls.supports_host_experts else [])
        names = [n for n in names if n not in set(exps)]
        what = f"layers {spec.layers.start}-{spec.layers.stop - 1}"
        try:
            self.ops = (backend_cls(gguf, names, config=config) if device_id is None
                        else backend_cls(gguf, names, device_id=device_id, config=config))
        except MemoryError:
            gib = sum(gguf.tensors[n].nbytes for n in names) / 2**30
            raise DeviceError(
                f"out of memory loading the weights of {what} ({gib:.1f} GiB) on "
                f"{backend_cls.name}: split the layers over more devices (--layer-split, "
                f"--devices) or use a smaller quant") from None
        if handoff != "host" or handoff_stream:
            # the chain's resolved --handoff / --handoff-stream (lite.engine.devices.resolve_handoff
            # allows them only on GPU stages, whose backend implements configure_handoff)
            self.ops.configure_handoff(handoff, handoff_stream)
        try:
            # on the stage's own GPU: allocated under another device's context, the cache of a
            # stage on GPU 1 sat on GPU 0 and every attention read it over the link
            # (the server keeps its KV in a paged pool instead, lite/engine/paged_kv.py)
            with self.ops.activate():
                self.kv = (KVCache(cfg, spec.layers, max_context, kv_kind, self.ops.xp)
                           if contiguous_kv else None)
        except MemoryError:
            n_attn = sum(not cfg.is_recurrent_layer(il) for il in spec.layers)
            gib = kv_bytes_per_token(cfg, n_attn, kv_kind) * max_context / 2**30
            raise DeviceError(
                f"out of memory allocating the KV cache of {what}: {max_context} positions "
                f"need {gib:.1f} GiB ({kv_kind}); lower -c/--max-context"
                + (" or use --kv int8" if kv_kind != "int8" else "")) from None
        self.residency = None
        if exps:
            try:
                with self.ops.activate():       # resident experts upload to this stage's GPU
                    self.residency = self.ops.place_experts(gguf, exps, experts, expert_cache)
            except MemoryError:
                raise DeviceError(f"out of memory placing the experts of {what}: try --experts host "
                                  f"or a smaller --expert-cache") from None
        self.all_logits = False   # the last stage returns logits of every position (tests, scoring)
        self.use_graphs = decode_graphs(self.ops, cfg, spec.layers)
        self._graph = None

    # --- StageRunner ---------------------------------------------------------------------------
    def run(self, job, x):
        if isinstance(job, StepJob):
            return self.run_step(job, x)
        if job.decode and self.use_graphs and job.n_tokens == 1:
            y = self._decode_graphed(x, job.start)
        else:
            y = self.forward(x, job.start, self.all_logits)
            if not job.decode and self.kv is not None:
                self.kv.recurrent.after_chunk(job.end, job.last)
        return self.ops.to_host(y) if self.spec.last else y

    def run_step(self, job, x):
        """A server step's rows through this stage (job.stage is its index): the step's decode
        graph replayed where the server's graphs serve this stage, else forward_batch over each
        sequence's KV view here. Returns hidden states, or the last stage's logits on the host."""
        si, graphs = job.stage, job.graphs
        if graphs is not None and graphs.serves(si, job.graph_step):
            return graphs.forward(si, x, job.graph_step)
        return self.forward_batch(x, job.starts, job.counts, job.kv_views(si))

    def pass_on(self, y, successor):
        """A server step's rows to the next stage (StageChain.decode of a StepJob): through the host
        to another device; on the same one the array itself, once this stage's stream has made it
        (the successor computes on its own stream)."""
        if successor.ops.device_key != self.ops.device_key:
            return self.ops.to_host(y)
        self.ops.synchronize()
        return y

    def _decode_graphed(self, x, pos):
        """One token through this stage by replaying its captured graph. The input is copied into
        a persistent device buffer and the position into the backend's device scalar, so the same
        graph serves every step. With the backend's pinned graph I/O (the default,
        lite/backends/cuda_graph_io.py) the graph itself starts by copying [token, position] from
        pinned memory: the host only writes the two numbers before the launch.
        A hybrid's recurrent states are buffers the graph updates in place: the warm-up and the
        capture must not count as a token (the states are put back after each), and the positions
        take() keeps are stepped on the host before each replay."""
        ops = self.ops
        io = ops.graph_io
        rec = getattr(self.kv, "recurrent", None) or None     # None: no recurrent layer here
        with ops.activate():
            if self._graph is None:
                snap = rec.snapshot() if rec is not None else None
                self._in = ops.persistent_input(x)
                ops.begin(pos, 1)
                self.forward_rows(ops, self._in, self.kv, pos)   # warm-up: compiles, fills the pool
                if rec is not None:
                    rec.put_back(snap)
                with self._in_graph(rec):
                    self._graph, self._out = ops.capture(lambda: self._captured_step(pos, io))
                if rec is not None:                        # (a host stand-in runs the capture)
                    rec.put_back(snap)
            if rec is not None:
                rec.step(pos)
            if io is None:
                ops.set_input(self._in, x)
                ops.begin(pos, 1)
            else:
                first = self.spec.first
                io.set_step(x if first else None, pos)
                if not first:
                    ops.set_input(self._in, x)             # hidden states: a device copy
            with self._in_graph(rec):
                ops.replay(self._graph)
            if io is not None:
                io.replayed(self.spec.last)
            return self._out

    @staticmethod
    def _in_graph(rec):
        """While capturing or replaying: the recurrent states' take() hands out buffers only."""
        return rec.replayed() if rec is not None else contextlib.nullcontext()

    def _captured_step(self, pos, io):
        if io is not None:
            io.capture_in()                                # the graph's first node
        return self.forward_rows(self.ops, self._in, self.kv, pos)

    def device_timer(self):
        """The chain's clock of this stage's device time: a StreamTimer on a GPU backend's stream,
        None on the CPU (there the device time is the host time)."""
        ops = self.ops
        return StreamTimer(ops.stream, ops.device) if ops.stream is not None else None

    def alloc_handoff(self, shape, dtype):
        return self.ops.alloc_handoff(shape, dtype)

    def to_handoff(self, y, buf):
        self.ops.to_handoff(y, buf)

    def from_handoff(self, buf):
        return self.ops.from_handoff(buf)

    def forward(self, x, pos0, all_logits=False):
        """x: token ids (T,) on the first stage, else hidden states (T, n_embd), at positions pos0..
        of this stage's KV cache. Returns hidden states, or on the last stage the logits (T or 1,
        n_vocab) as float32."""
        with self.ops.activate():
            rows = None if all_logits or x.shape[0] == 1 else last_row
            return self.forward_rows(self.ops, x, self.kv, pos0, rows)

    def forward_batch(self, x, starts, counts, kvs):
        """Rows of several sequences stacked: token ids (sum(counts),) on the first stage, else
        hidden states; sequence i's counts[i] rows sit at positions starts[i].. of its KV view
        kvs[i] (lite/engine/paged_kv.py BatchOps). Returns hidden states, or on the last stage the logits
        (len(counts), n_vocab) of each sequence's last row."""
        with self.ops.activate():
            ops = batch_ops(self.ops, starts, counts, kvs)
            if not self.spec.first and isinstance(x, np.ndarray) and ops.xp is not np:
                x = ops.xp.asarray(x)              # hidden states from a stage on another device
            y = self.forward_rows(ops, x, rows=ops.last_rows)
            return self.ops.to_host(y) if self.spec.last else y

    def forward_rows(self, ops, x, kv=None, pos0=0, rows=None):
        """The forward of this stage's layers, inside activate(), for one sequence and for a step
        of several alike. One sequence: `ops` the backend, `kv` its KVCache, x's rows at positions
        pos0... A step: `ops` its BatchOps (each sequence's positions and KV view are in it; the
        server's decode graphs capture this over persistent buffers, lite/engine/paged_cuda.py
        DecodeGraphs), kv None. Returns the hidden states, or on the last stage the logits, still
        on the device, of the rows `rows(x)` picks (None: every row)."""
        cfg = self.cfg
        ops.begin(pos0, x.shape[0])
        if self.spec.first:
            x = ops.embed(x)
            if cfg.embed_scale != 1.0:
                x = ops.scale(x, cfg.embed_scale)
        for il in self.spec.layers:
            x = self.fwd(ops, cfg, il, x, kv, pos0)
        if not self.spec.last:              # (the last residual add may be lazy: cuda_norm.py)
            return ops.done(x)
        if rows is not None:
            x = rows(x)
        x = ops.rms_norm(x, "output_norm.weight", cfg.rms_eps)
        return ops.output(x)


def last_row(x):
    """The rows a prompt chunk's logits are of: its last one."""
    return x[-1:]


def decode_graphs(ops, cfg, layers):
    """Does a decode step of a stage with these layers replay one captured CUDA graph? Launching
    its few hundred kernels one by one from Python costs more host time than the GPU needs. MoE
    stages capture when the backend's grouped expert path needs no host sync; stages with
    recurrent layers or a shared expert only with BackendConfig.hybrid_graphs (their states are
    stepped around the replays, Stage._decode_graphed, and the shared gate is then a kernel)."""
    if not ops.supports_graphs:
        return False
    if cfg.is_moe and not ops.moe_graph_safe():
        return False
    hybrid = cfg.n_ff_shexp or any(cfg.is_recurrent_layer(il) for il in layers)
    if hybrid and not ops.config.hybrid_graphs:      # a backend with graphs has a BackendConfig
        return False
    return ops.graph_safe()


def as_ids(ids):
    return np.asarray(ids, dtype=np.int32)
