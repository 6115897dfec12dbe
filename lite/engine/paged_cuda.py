"""The batched step's ops on a CUDA stage: BatchOps (lite/engine/paged_kv.py) with RoPE, the KV store into
the pages and decode attention done for all rows of a step in few launches.

Per attention layer, whatever the number of sequences:
  - one rope-store launch (kernels/paged_attention.py): every row's q and k rotated at the row's own
    position, k and v stored into its page slot;
  - one paged decode attention launch for every sequence that has one row this step (decoding, or a
    prompt's last lone token), each against its own length and block table;
  - for the sequences with several rows (prompt chunks), with BackendConfig.paged_flash where the
    flash kernel takes the head dims: one flash attention launch over the pages for all of them
    (kernels/flash_attention.py paged_prefill), each chunk through its block table (one launch,
    not one a chunk: launches cost host time, and short chunks fill the GPU together); else, per
    chunk, its pages gathered into a contiguous fp16 copy (a copy of its context a layer) for the
    backend's own prefill attention (attend).
rope() leaves the rotation to attention (a _Rotation), as the backend's own one-token path does;
a one-row step may hand attention the backend's deferred per-head norms (NormLater), which are
resolved first (its norm_now). Every other op is the backend's own over all rows; the lazy values
a one-row step makes there (AddLater, ScaledLater: lite/backends/cuda_norm.py) stay inside it.

Where a step's rows go is worked out on the host once per step and stage (StepLayout) and uploaded
in one copy. A pure-decode step the server replays from a CUDA graph (DecodeGraphs, at the end) reads
the same arrays from persistent buffers instead (DecodeLayout), padded to its batch-size bucket.
"""
import logging

import numpy as np

from lite.errors import ContextOverflowError
from lite.engine.paged_kv import BatchOps

log = logging.getLogger(__name__)


def batch_ops(backend, starts, counts, kvs):
    """The batched step's ops over this stage's backend: CUDABatchOps on a CUDA stage, else BatchOps."""
    cls = CUDABatchOps if backend.name == "cuda" else BatchOps
    return cls(backend, starts, counts, kvs)


class _Rotation:
    """What CUDABatchOps.rope returns: the input (an array, or a NormLater of a one-row step) and its
    rotation (n_rot, base, freq_scale, neox), applied by the rope-store launch. Only attention
    takes it; anything else fails on it loudly."""

    def __init__(self, x, rope):
        self.x, self.rope, self.shape = x, rope, x.shape

    def __getattr__(self, name):
        raise TypeError(f"a rotation left for the batched attention (_Rotation) has no {name!r}: "
                        f"only CUDABatchOps.attention takes rope()'s output")


class StepLayout:
    """The rows of one step, on the host and (one upload) on the device as int32 arrays:
    positions, slots (R,): every row's position and page slot (block * B + offset);
    query_rows, lens (N,), tables (N, max_blocks): the N sequences of one row, their row, length
    (position + 1) and block table (zero-padded); chunks: (sequence, first row, end row) of the
    sequences of several rows, and for the paged prefill attention chunk_rows (C, 3) (first row,
    rows, first position), chunk_tables (C, blocks) and max_chunk (their most rows). All sequences
    share one pool (the stage's)."""

    def __init__(self, starts, rows, kvs, xp):
        self.pool = kvs[0].pool
        if any(kv.pool is not self.pool for kv in kvs):
            raise ValueError("the sequences of one batched step must share their stage's pool")
        B, R = self.pool.block_size, rows[-1]
        pos, slots = np.empty(R, np.int64), np.empty(R, np.int64)
        singles, self.chunks = [], []
        for i, (s, kv) in enumerate(zip(starts, kvs)):
            r0, r1 = rows[i], rows[i + 1]
            kv.check_fits(s + r1 - r0)
            p = np.arange(s, s + r1 - r0)
            table = np.asarray(kv.table, np.int64)
            if len(table) * B < s + r1 - r0:
                raise ValueError(f"sequence {i}: {len(table)} blocks cannot hold {s + r1 - r0} positions")
            pos[r0:r1], slots[r0:r1] = p, table[p // B] * B + p % B
            (singles if r1 - r0 == 1 else self.chunks).append((i, r0, r1))
        self.n_single = N = len(singles)
        lens = np.asarray([starts[i] + 1 for i, _, _ in singles], np.int64)
        width = max([-(-int(L) // B) for L in lens], default=1)
        tables = np.zeros((N, width), np.int64)
        for j, (i, _, _) in enumerate(singles):
            t = kvs[i].table[:-(-int(lens[j]) // B)]
            tables[j, :len(t)] = t
        self.max_len = int(lens.max()) if N else 0
        ends = [starts[i] + r1 - r0 for i, r0, r1 in self.chunks]
        ctables = np.zeros((len(ends), max([-(-e // B) for e in ends], default=1)), np.int64)
        for j, (i, _, _) in enumerate(self.chunks):
            t = kvs[i].table[:-(-ends[j] // B)]
            ctables[j, :len(t)] = t
        crows = np.asarray([(r0, r1 - r0, starts[i]) for i, r0, r1 in self.chunks], np.int64)
        self.max_chunk = max([r1 - r0 for _, r0, r1 in self.chunks], default=0)
        packed = np.concatenate([pos, slots, np.asarray([r0 for _, r0, _ in singles], np.int64), lens,
                                 tables.ravel(), crows.ravel(), ctables.ravel()])
        if packed.size and packed.max() >= 2**31:
            raise ValueError("page slots past int32")
        dev = xp.asarray(packed.astype(np.int32))
        self.positions, self.slots = dev[:R], dev[R:2 * R]
        self.query_rows, self.lens = dev[2 * R:2 * R + N], dev[2 * R + N:2 * R + 2 * N]
        at = 2 * R + 2 * N + tables.size
        self.tables = dev[2 * R + 2 * N:at].reshape(N, width)
        self.chunk_rows = dev[at:at + crows.size].reshape(len(ends), 3)
        self.chunk_tables = dev[at + crows.size:].reshape(ctables.shape)


def decode_step_host(ids, starts, tables, size, block_size, max_context):
    """DecodeLayout's host array for one pure-decode step: sequence i's token ids[i] at position
    starts[i], its KV through block table tables[i]; rows len(starts)..size-1 are padding."""
    P, B, N = int(size), int(block_size), len(starts)
    W = -(-int(max_context) // B)
    if not 0 < N <= P or len(ids) != N or len(tables) != N:
        raise ValueError(f"{N} sequences ({len(ids)} ids, {len(tables)} tables) in a step of {P} rows")
    out = np.zeros(P * (5 + W), np.int32)
    tok, pos, slots, rows, lens = (out[k * P:(k + 1) * P] for k in range(5))
    tab = out[5 * P:].reshape(P, W)
    tok[:N], rows[:] = ids, np.arange(P)
    slots[N:], lens[N:] = -1, 1                     # padding: stores nothing, attends to one key
    for i, (s, table) in enumerate(zip(starts, tables)):
        s = int(s)
        if s + 1 > max_context:
            raise ContextOverflowError(f"{s + 1} tokens do not fit the context of {max_context}")
        nb = s // B + 1
        if len(table) < nb:
            raise ValueError(f"sequence {i}: {len(table)} blocks cannot hold {s + 1} positions")
        slot = int(table[s // B]) * B + s % B
        if slot >= 2**31:
            raise ValueError("page slots past int32")
        pos[i], lens[i], slots[i] = s, s + 1, slot
        tab[i, :nb] = table[:nb]
    return out


class DecodeLayout:
    """StepLayout's arrays for a pure-decode step (one row a sequence) padded to `size` rows, at
    fixed addresses: a captured graph reads them where they were at capture. In front, the first
    stage's token ids (`ids`), so one host-to-device copy (from pinned memory) refills all of it
    before each replay (upload). The tables are as wide as the context and max_len is the whole
    context, so the attention's grid and split count are the same at every step. On the host (xp
    numpy) the device arrays are the host array itself."""
    chunks = ()                                     # no prompt chunks in a decode step

    def __init__(self, pool, size, max_context, xp, empty_pinned=None):
        self.pool, self.size = pool, int(size)
        W = -(-int(max_context) // pool.block_size)
        self.n_single, self.max_len = self.size, W * pool.block_size
        n, P = self.size * (5 + W), self.size
        self.host = empty_pinned(n, np.int32) if empty_pinned is not None else np.zeros(n, np.int32)
        self.host[...] = 0
        self.dev = self.host if xp is np else xp.zeros(n, np.int32)
        self.ids, self.positions, self.slots, self.query_rows, self.lens = (
            self.dev[k * P:(k + 1) * P] for k in range(5))
        self.tables = self.dev[5 * P:].reshape(P, W)

    def upload(self, packed, stream=None):
        """This step's arrays (decode_step_host's) into the buffers, one copy on `stream`; the host
        writes the pinned buffer only after the previous step's copy is done (every step ends
        with the host waiting for the last stage's logits)."""
        if packed.shape != self.host.shape:
            raise ValueError(f"a step of {packed.size} int32 for a layout of {self.host.size}")
        self.host[...] = packed
        if self.dev is not self.host:
            self.dev.set(self.host, stream=stream)


class CUDABatchOps(BatchOps):
    def __init__(self, ops, starts, counts, kvs, kernels=None, layout=None):
        # layout: a DecodeLayout the step reads (the decode graphs'); None: a StepLayout of this step
        super().__init__(ops, starts, counts, kvs)
        self._kernels, self._layout = kernels, layout

    @property
    def kernels(self):
        """kernels/paged_attention.py (the tests hand in one compiled by the host emulator)."""
        if self._kernels is None:
            from lite.kernels import paged_attention
            self._kernels = paged_attention
        return self._kernels

    @property
    def flash(self):
        """kernels/flash_attention.py (the tests' one compiled by the host emulator where installed)."""
        from lite.kernels import flash_attention
        return flash_attention

    def layout(self):
        if self._layout is None:
            self._layout = StepLayout(self.starts, self.rows, self.kvs, self.ops.xp)
        return self._layout

    def rope(self, x, pos0, base, neox, n_rot=None, freq_scale=1.0, freq_factors=None):
        if freq_factors is not None:
            raise NotImplementedError("rope frequency factors on the GPU")
        return _Rotation(x, (n_rot or x.shape[-1], base, freq_scale, neox))

    def attention(self, kv, il, q, k, v, pos0, scale, window=0):
        """Rows (R, H, D) of q, (R, Hkv, D) of k and v of every sequence -> (R, H * Dv)."""
        ops, xp, kern = self.ops, self.ops.xp, self.kernels
        rope = None
        if isinstance(q, _Rotation) or isinstance(k, _Rotation):
            if not (isinstance(q, _Rotation) and isinstance(k, _Rotation) and q.rope == k.rope):
                raise NotImplementedError("the batched step rotates q and k alike, or neither")
            rope, q, k = q.rope, q.x, k.x
        # a one-row step's deferred q/k norms
        q, k, v = (xp.ascontiguousarray(ops.norm_now(t)) for t in (q, k, v))
        lay = self.layout()
        pool, stream = lay.pool, ops.stream
        if pool.kind not in ("f16", "int8"):
            raise NotImplementedError(f"--kv {pool.kind} in the GPU's batched step (f16 or int8)")
        K, V = pool.k[il], pool.v[il]
        ks, vs = (pool.ks[il], pool.vs[il]) if pool.kind == "int8" else (None, None)
        q_rot = kern.rope_store(q, k, v, K, V, ks, vs, lay.positions, lay.slots, rope, stream)
        R, H = q.shape[:2]
        out = xp.empty((R, H * v.shape[-1]), np.float32)
        if lay.n_single:
            keys = min(lay.max_len, window) if window else lay.max_len
            kern.attention(q_rot, lay.query_rows, lay.lens, lay.tables, K, V, ks, vs, scale, window,
                           stream, out=out, max_keys=keys)
        if lay.chunks and ops.paged_flash_takes(q.shape[2], v.shape[2]):
            self.flash.paged_prefill(q_rot, lay.chunk_rows, lay.chunk_tables, K, V, ks, vs,
                                     lay.max_chunk, scale, window, stream, out=out)
        else:
            for i, r0, r1 in lay.chunks:
                out[r0:r1] = self._attend_gathered(i, il, q_rot[r0:r1], scale, window)
        return out

    def _attend_gathered(self, i, il, q, scale, window):
        """Sequence i's chunk q (its k and v already in the pages) against its pages gathered into
        a contiguous fp16 copy, through the backend's prefill attention: where the paged flash
        kernel does not serve the head dims (or BackendConfig.paged_flash is off)."""
        start = self.starts[i]
        K, V = self.kvs[i].read(il, start + q.shape[0], np.float16)
        return self.ops.attend(q, K, V, start, scale, window)


# --- CUDA graphs of the pure-decode steps -------------------------------------------------------
# CUDA graphs of the server's pure-decode steps: one per stage and batch-size bucket.
#
# Launched op by op from Python, a batched step is host-bound (a few hundred launches a step, each
# costing more host time than its GPU work; BENCHMARKS.md has the figures).
# A step whose every sequence has one row (decoding, or a prompt's lone last token) is rounded up
# to a bucket of rows (1, 2, 4, 8, ... up to n_slots), and each stage replays its graph for that
# bucket, captured the first time the bucket comes up, after one eager warm-up on the same inputs
# (it compiles that row count's kernels; the K/V it writes for this step's positions are the ones
# the replay writes again). A graph reads fixed addresses: the token ids (first stage) or hidden
# states, and the step's layout (DecodeLayout, above), refilled by one host-to-device
# copy before each replay; the logits go to the host after it, from the graph's output buffer.
# Pad rows: token 0 at position 0, slot -1 (nothing stored), one key over a zero table row;
# their outputs are dropped.
#
# Steps with prompt chunks run eagerly (Stage.forward_batch), as does every step of a bucket past the
# stage's max_rows (where a product would call cuBLAS, which CuPy refuses to capture: past the 8-row
# fused matvecs' reach, unless BackendConfig.batched_mma covers the stage's weights; an MoE stage's
# experts on the device also past their sorted products' reach, off it past their decode) or whose
# capture failed (logged once).


def buckets(n_slots):
    """The row counts graphs are captured for: the powers of two below n_slots, then n_slots."""
    out, b = [], 1
    while b < n_slots:
        out.append(b)
        b *= 2
    return out + [int(n_slots)]


def bucket(n, n_slots):
    """The bucket a step of n sequences runs in: the smallest one of at least n rows."""
    for b in buckets(n_slots):
        if b >= n:
            return b
    raise ValueError(f"{n} sequences in a step of at most {n_slots}")


def graphable(stage):
    """Can this stage replay graphs of decode steps? A CUDA stage whose own decode step may be
    captured (Stage.use_graphs: a fused matvec for every weight, MoE experts on the grouped
    kernels) and no recurrent layer: a hybrid's sequences each bring their own conv and
    delta-rule states, taken on the host (RecurrentState.take) at addresses a graph cannot follow."""
    ops = stage.ops
    recurrent = any(stage.cfg.is_recurrent_layer(il) for il in stage.spec.layers)
    return ops.name == "cuda" and ops.supports_graphs and stage.use_graphs and not recurrent


def max_rows(stage, n_slots):
    """The most rows this stage's graphs take (0: none)."""
    if not graphable(stage):
        return 0
    if stage.cfg.is_moe:                          # past it the router or an expert product would call cuBLAS
        return min(n_slots, stage.ops.moe_graph_rows())
    return min(n_slots, stage.ops.graph_rows())    # past it a product would call cuBLAS


class DecodeStep:
    """One pure-decode step on the host: n sequences in a bucket of `size` rows, and the packed
    arrays every stage's layout copies (decode_step_host)."""

    def __init__(self, size, n, host):
        self.size, self.n, self.host = size, n, host


class _Graph:
    """One stage's graph of one bucket: its persistent inputs, then the graph and its output."""

    def __init__(self, stage, pool, size, max_context):
        xp = stage.ops.xp
        pinned = None
        if xp is not np:
            import cupyx
            pinned = cupyx.empty_pinned
        self.xp, self.first = xp, stage.spec.first
        self.layout = DecodeLayout(pool, size, max_context, xp, pinned)
        self.x = self.layout.ids if self.first else None     # hidden states: made at the first input
        self.ops = CUDABatchOps(stage.ops, [0] * size, [1] * size, None, layout=self.layout)
        self.graph = self.out = None
        self.failed = False

    def set_inputs(self, x, step, stream):
        """This step's layout (and ids) in one copy; on a later stage its n rows of hidden states."""
        self.layout.upload(step.host, stream)
        if self.first:
            return
        n = step.n
        if self.x is None:
            self.x = self.xp.zeros((self.layout.size,) + tuple(x.shape[1:]), x.dtype)
        if isinstance(x, self.xp.ndarray):
            self.x[:n] = x[:n]                 # from a stage on this device: a copy on the stream
        else:                                  # through the host from another device
            self.x[:n].set(np.ascontiguousarray(x[:n], dtype=self.x.dtype), stream=stream)


class DecodeGraphs:
    """The scheduler's decode graphs (Scheduler(graphs=False): none, every step eager)."""

    def __init__(self, stages, pools, n_slots, max_context, enabled=True):
        self.stages, self.pools = stages, pools
        self.n_slots, self.max_context = int(n_slots), int(max_context)
        self.max_rows = [max_rows(st, self.n_slots) if enabled else 0 for st in stages]
        self.graphs = {}                       # (stage index, bucket) -> _Graph
        self.replays = self.captures = 0

    def step(self, ids, starts, counts, tables):
        """This step as a DecodeStep when it is pure decode and some stage replays its bucket,
        else None (it runs eagerly)."""
        if not any(self.max_rows) or any(n != 1 for n in counts):
            return None
        size = bucket(len(counts), self.n_slots)
        if not any(self._serves(si, size) for si in range(len(self.stages))):
            return None
        B = self.pools[0].block_size
        return DecodeStep(size, len(counts),
                          decode_step_host(ids, starts, tables, size, B, self.max_context))

    def serves(self, si, step):
        """Does stage si run this step from a graph?"""
        return step is not None and self._serves(si, step.size)

    def _serves(self, si, size):
        g = self.graphs.get((si, size))
        return size <= self.max_rows[si] and not (g is not None and g.failed)

    def forward(self, si, x, step):
        """Stage si's forward_batch of this step: its bucket's graph replayed (captured first if
        new). x: what forward_batch takes (ids: ignored, they come with the layout)."""
        stage, key = self.stages[si], (si, step.size)
        ops = stage.ops
        with ops.activate():
            g = self.graphs.get(key)
            if g is None:
                g = self.graphs[key] = _Graph(stage, self.pools[si], step.size, self.max_context)
            g.set_inputs(x, step, ops.stream)
            if g.graph is None:
                y = self._capture(si, stage, g)
                if g.failed:                   # this step's output is the warm-up's
                    return self._output(stage, y, step.n)
            ops.replay(g.graph)
            self.replays += 1
            return self._output(stage, g.out, step.n)

    def _capture(self, si, stage, g):
        """Warm up, then capture g's graph; the warm-up's output where the capture fails."""
        def run():
            return stage.forward_rows(g.ops, g.x)          # one row a sequence: every row's logits
        y = run()
        try:
            g.graph, g.out = stage.ops.capture(run)
        except Exception as e:        # (no crash: this bucket keeps the eager step)
            g.failed, g.graph = True, None
            log.warning("lite serve: the decode step of %d rows on stage %d could not be captured "
                        "in a CUDA graph (%s: %s); steps of that size run without one",
                        g.layout.size, si, type(e).__name__, e)
            return y
        self.captures += 1
        return None

    @staticmethod
    def _output(stage, y, n):
        y = y[:n]                             # the pad rows' outputs are dropped
        return stage.ops.to_host(y) if stage.spec.last else y
