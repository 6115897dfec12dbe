"""The batched step's ops on a CUDA stage: BatchOps (lite/paged_kv.py) with RoPE, the KV store into
the pages and decode attention done for all rows of a step in few launches.

Per attention layer, whatever the number of sequences:
  - one rope-store launch (kernels/paged_attention.py): every row's q and k rotated at the row's own
    position, k and v stored into its page slot;
  - one paged decode attention launch for every sequence that has one row this step (decoding, or a
    prompt's last lone token), each against its own length and block table;
  - per sequence with several rows (a prompt chunk): its pages gathered into the contiguous fp16
    layout of KVCache, then the backend's own prefill attention (flash attention where the head
    dims allow) — a copy of its context a layer, the price of reusing that kernel.
rope() leaves the rotation to attention (a _Rotation), as the backend's own one-token path does;
a one-row step may hand attention the backend's deferred per-head norms (NormLater), which are
resolved first (its _norm_now). Every other op is the backend's own over all rows; the lazy values
a one-row step makes there (AddLater, ScaledLater: lite/backends/cuda_norm.py) stay inside it.

Where a step's rows go is worked out on the host once per step and stage (StepLayout) and uploaded
in one copy.
"""
import numpy as np

from lite.paged_kv import BatchOps


def batch_ops(backend, starts, counts, kvs):
    """The batched step's ops over this stage's backend: CUDABatchOps on a CUDA stage, else BatchOps."""
    cls = CUDABatchOps if getattr(backend, "name", None) == "cuda" else BatchOps
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
    sequences of several rows. All sequences share one pool (the stage's)."""

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
        packed = np.concatenate([pos, slots, np.asarray([r0 for _, r0, _ in singles], np.int64), lens,
                                 tables.ravel()])
        if packed.size and packed.max() >= 2**31:
            raise ValueError("page slots past int32")
        dev = xp.asarray(packed.astype(np.int32))
        self.positions, self.slots = dev[:R], dev[R:2 * R]
        self.query_rows, self.lens = dev[2 * R:2 * R + N], dev[2 * R + N:2 * R + 2 * N]
        self.tables = dev[2 * R + 2 * N:].reshape(N, width)


class _Gathered:
    """A prompt chunk's view of its first n positions of layer il, gathered from its pages into the
    contiguous (Hkv, n, D) float16 layout the backend's prefill attention reads (KVCache's, kind
    f16; int8 pages dequantized). The rope-store launch already stored the chunk's rows, so write()
    has nothing left to do."""
    kind = "f16"

    def __init__(self, paged, il, n):
        k, v = paged.read(il, n, np.float16)
        self.k, self.v = {il: k}, {il: v}

    def write(self, il, k, v, pos0):
        pass

    def read(self, il, n):                     # as KVCache.read (backends that take float32)
        return self.k[il][:, :n].astype(np.float32), self.v[il][:, :n].astype(np.float32)


class CUDABatchOps(BatchOps):
    def __init__(self, ops, starts, counts, kvs, kernels=None):
        super().__init__(ops, starts, counts, kvs)
        self._kernels, self._layout = kernels, None

    @property
    def kernels(self):
        """kernels/paged_attention.py (the tests hand in one compiled by the host emulator)."""
        if self._kernels is None:
            from lite.kernels import paged_attention
            self._kernels = paged_attention
        return self._kernels

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
        now = getattr(ops, "_norm_now", lambda t: t)       # a one-row step's deferred q/k norms
        q, k, v = (xp.ascontiguousarray(now(t)) for t in (q, k, v))
        lay = self.layout()
        pool, stream = lay.pool, getattr(ops, "stream", None)
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
        for i, r0, r1 in lay.chunks:
            n = self.starts[i] + r1 - r0
            out[r0:r1] = ops.attention(_Gathered(self.kvs[i], il, n), il, q_rot[r0:r1], k[r0:r1],
                                       v[r0:r1], self.starts[i], scale, window)
        return out
