"""The paged KV cache of the server: fixed-size blocks of positions from one pool per stage.

BlockManager hands out block ids (the same ids on every stage, since each stage keeps the KV of
its own layers for the same positions), counts references, and keeps a prefix cache: a full block
is keyed by a hash of its tokens chained with the hash of the blocks before it, so a block holds
the KV of exactly that prefix; a block nobody references keeps its KV and its key until it is
taken for new tokens, least recently released first.

BlockPool is one stage's storage; PagedKV is one sequence's view of one pool with the interface
the backends' attention uses for the contiguous KVCache (write, read, check_fits).
"""
from collections import OrderedDict, deque

import numpy as np

from lite.backends.ops import Ops
from lite.errors import ContextOverflowError
from lite.engine.kv_cache import KV_KINDS

DEFAULT_BLOCK_SIZE = 16


def block_hashes(ids, block_size, parent=None):
    """The chained keys of the full blocks of ids: key i covers ids[:(i + 1) * block_size]."""
    out = []
    for b in range(len(ids) // block_size):
        parent = hash((parent, tuple(ids[b * block_size:(b + 1) * block_size])))
        out.append(parent)
    return out


class BlockManager:
    def __init__(self, n_blocks, block_size=DEFAULT_BLOCK_SIZE):
        self.n_blocks, self.block_size = int(n_blocks), int(block_size)
        self.refs = [0] * self.n_blocks
        self.unkeyed = deque(range(self.n_blocks))   # free, holding no reusable KV
        self.idle = OrderedDict()                    # free but keyed: block -> key, oldest first
        self.by_key, self.key_of = {}, {}

    @property
    def n_free(self):
        """Blocks no sequence references (prefix-cached ones count: they are taken on demand)."""
        return len(self.unkeyed) + len(self.idle)

    @property
    def n_cached(self):
        return len(self.by_key)

    def match(self, keys):
        """Take a reference on the blocks of the longest cached run of keys; returns the blocks."""
        got = []
        for k in keys:
            b = self.by_key.get(k)
            if b is None:
                break
            self._take(b)
            got.append(b)
        return got

    def allocate(self):
        if self.unkeyed:
            b = self.unkeyed.popleft()
        elif self.idle:
            b, key = self.idle.popitem(last=False)        # the least recently released
            del self.by_key[key], self.key_of[b]
        else:
            raise ContextOverflowError("the KV pool is full")   # the scheduler sizes it so it is not
        self.refs[b] = 1
        return b

    def register(self, block, key):
        """Key a block that now holds the KV of the prefix `key` names (once: a prefix computed by
        two sequences at once stays in the block that was keyed first)."""
        if key not in self.by_key and block not in self.key_of:
            self.by_key[key], self.key_of[block] = block, key

    def release(self, blocks):
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if b in self.key_of:
                    self.idle[b] = self.key_of[b]
                else:
                    self.unkeyed.append(b)

    def _take(self, b):
        if self.refs[b] == 0:
            self.idle.pop(b, None)
        self.refs[b] += 1


def _quantize(xp, x):                         # x (T, H, D) f32 -> int8 (T, H, D), scales (T, H)
    amax = xp.abs(x).max(axis=-1)
    scale = (amax / 127.0).astype(np.float32)
    safe = xp.where(scale > 0, scale, np.float32(1.0))
    return xp.clip(xp.rint(x / safe[..., None]), -127, 127).astype(np.int8), scale


class BlockPool:
    """One stage's KV storage for n_blocks blocks of block_size positions, in the array module xp of
    the stage's backend (numpy: host memory; cupy: the current device, so a GPU stage allocates it
    under its backend's activate()). A hybrid's recurrent layers get none."""

    def __init__(self, cfg, layers, n_blocks, block_size=DEFAULT_BLOCK_SIZE, kind="f16", xp=np):
        if kind not in KV_KINDS:
            raise ValueError(f"kv cache type must be one of {', '.join(KV_KINDS)}, got {kind!r}")
        self.kind, self.block_size, self.xp = kind, int(block_size), xp
        dtype = {"f32": np.float32, "f16": np.float16, "int8": np.int8}[kind]
        shape = (n_blocks, cfg.n_head_kv, self.block_size)
        layers = [il for il in layers if not cfg.is_recurrent_layer(il)]
        self.k = {il: xp.zeros(shape + (cfg.head_dim,), dtype) for il in layers}     # (N, Hkv, B, D)
        self.v = {il: xp.zeros(shape + (cfg.v_head_dim,), dtype) for il in layers}   # (N, Hkv, B, Dv)
        if kind == "int8":
            self.ks = {il: xp.zeros(shape, np.float32) for il in layers}              # (N, Hkv, B)
            self.vs = {il: xp.zeros(shape, np.float32) for il in layers}


class PagedKV:
    """One sequence's KV on one stage: positions p live in block table[p // B] at p % B; a
    hybrid's recurrent layers keep the sequence's RecurrentState beside it."""

    def __init__(self, pool, table, max_context, recurrent=None):
        self.pool, self.table, self.max_context = pool, table, int(max_context)
        self.recurrent = recurrent

    def check_fits(self, n_tokens):
        if n_tokens > self.max_context:
            raise ContextOverflowError(f"{n_tokens} tokens do not fit the context of {self.max_context}")

    def write(self, il, k, v, pos0):
        """k (T, Hkv, D), v (T, Hkv, Dv) float32 at positions pos0..pos0+T-1 (blocks allocated), as
        arrays of the pool's module. (A CUDA stage's batched step stores through its rope-store
        kernel instead: lite/engine/paged_cuda.py.)"""
        pool, B, xp = self.pool, self.pool.block_size, self.pool.xp
        pos = np.arange(pos0, pos0 + k.shape[0])
        blk, off = (xp.asarray(a) for a in (np.asarray(self.table, np.int64)[pos // B], pos % B))
        if pool.kind == "int8":
            (qk, sk), (qv, sv) = _quantize(xp, k), _quantize(xp, v)
            pool.k[il][blk, :, off], pool.ks[il][blk, :, off] = qk, sk
            pool.v[il][blk, :, off], pool.vs[il][blk, :, off] = qv, sv
        else:
            pool.k[il][blk, :, off] = k
            pool.v[il][blk, :, off] = v

    def _gather(self, arrays, il, n):           # the first n positions, blocks laid end to end
        blocks = self.pool.xp.asarray(np.asarray(self.table[:-(-n // self.pool.block_size)], np.int64))
        a = arrays[il][blocks]                  # (nb, Hkv, B, ...)
        a = a.swapaxes(0, 1)
        return a.reshape((a.shape[0], -1) + a.shape[3:])[:, :n]

    def read(self, il, n, dtype=np.float32):
        """The first n positions as dtype (float32, or float16 for a GPU's prefill attention):
        (Hkv, n, D), (Hkv, n, Dv), contiguous."""
        pool, xp = self.pool, self.pool.xp
        k, v = self._gather(pool.k, il, n), self._gather(pool.v, il, n)
        if pool.kind == "int8":
            k = k.astype(np.float32) * self._gather(pool.ks, il, n)[..., None]
            v = v.astype(np.float32) * self._gather(pool.vs, il, n)[..., None]
        return (xp.ascontiguousarray(k.astype(dtype, copy=False)),
                xp.ascontiguousarray(v.astype(dtype, copy=False)))


# --- the batched step's ops ---------------------------------------------------------------------
# One forward over the stacked rows of several sequences: the batched step of the server.
#
# A layer's forward (models/*.py) sees BatchOps as its backend. Every op that treats rows alone
# (embedding, norms, products with the weights, activations, experts) runs once on all rows, so each
# weight is read once per step; RoPE and attention, which depend on a row's position and on its own
# sequence's KV, run per sequence on that sequence's rows; so do a hybrid's causal conv and delta
# rule, on the recurrent state each sequence's KV view carries (kvs[i].recurrent). A sequence contributes one row in decode
# and a chunk of rows while its prompt is prefilled, so one step can mix both. On a CUDA stage,
# CUDABatchOps (lite/engine/paged_cuda.py) does RoPE and attention of all rows in a few launches instead.
class BatchOps(Ops):
    fused_delta_step = False     # each sequence's recurrent states are their own (delta_rule below)

    def __init__(self, ops, starts, counts, kvs):
        # sequence i: rows rows[i]:rows[i + 1], first position starts[i], KV view kvs[i]; a CPU
        # stage's products in its row_invariant view, so a row's logits do not depend on the batch
        self.ops, self.starts, self.kvs = ops.row_invariant, starts, kvs
        self.rows = [0]
        for n in counts:
            self.rows.append(self.rows[-1] + n)

    # the backend's own, over all rows: the ops that treat rows alone, and its capabilities
    name = property(lambda self: self.ops.name)
    xp = property(lambda self: self.ops.xp)
    device_key = property(lambda self: self.ops.device_key)
    stream = property(lambda self: self.ops.stream)
    moe_residual = property(lambda self: self.ops.moe_residual)
    folds_residuals = property(lambda self: self.ops.folds_residuals)

    def embed(self, ids):
        return self.ops.embed(ids)

    def has(self, name):
        return self.ops.has(name)

    def linear(self, x, name):
        return self.ops.linear(x, name)

    def linear_many(self, x, names):
        return self.ops.linear_many(x, names)

    def linear_add(self, x, name, res):
        return self.ops.linear_add(x, name, res)

    def linear_gated(self, x, names, act):
        return self.ops.linear_gated(x, names, act)

    def rms_norm(self, x, name, eps):
        return self.ops.rms_norm(x, name, eps)

    def add_rms_norm(self, x, y, name, eps):
        return self.ops.add_rms_norm(x, y, name, eps)

    def act_mul(self, gate, up, act):
        return self.ops.act_mul(gate, up, act)

    def add(self, a, b):
        return self.ops.add(a, b)

    def scale(self, x, s):
        return self.ops.scale(x, s)

    def moe_route(self, h, name, k, normalize):
        return self.ops.moe_route(h, name, k, normalize)

    def moe_experts(self, h, il, ids, weights, act, **kw):   # residual=: where moe_residual
        return self.ops.moe_experts(h, il, ids, weights, act, **kw)

    def sigmoid_gate(self, x, h, name):
        return self.ops.sigmoid_gate(x, h, name)

    def add_sigmoid_gated(self, base, x, h, name):
        return self.ops.add_sigmoid_gated(base, x, h, name)

    def sigmoid_mul(self, x, gate):
        return self.ops.sigmoid_mul(x, gate)

    def l2_norm(self, x, eps):
        return self.ops.l2_norm(x, eps)

    def concat(self, xs):
        return self.ops.concat(xs)

    def delta_gates(self, b, a, a_name, dt_bias_name):
        return self.ops.delta_gates(b, a, a_name, dt_bias_name)

    def output(self, x):
        return self.ops.output(x)

    def to_host(self, x):
        return self.ops.to_host(x)

    def done(self, x):
        return self.ops.done(x)

    def norm_now(self, x):
        return self.ops.norm_now(x)

    def last_rows(self, x):
        """Each sequence's last row, whose logits the step returns (a prompt chunk has several)."""
        if x.shape[0] == len(self.rows) - 1:
            return x
        return self.done(x)[self.xp.asarray(np.asarray(self.rows[1:]) - 1)]

    def activate(self):
        return self.ops.activate()

    def synchronize(self):
        self.ops.synchronize()

    # positions are per sequence: RoPE, attention and the recurrent state
    def begin(self, pos0, n_tokens):
        pass

    def _per_sequence(self, fn, *xs):
        r = self.rows
        parts = [fn(i, *(x[r[i]:r[i + 1]] for x in xs)) for i in range(len(self.starts))]
        return parts[0] if len(parts) == 1 else self.ops.xp.concatenate(parts)

    def rope(self, x, pos0, *args, **kw):
        return self._per_sequence(lambda i, xi: self.ops.rope(xi, self.starts[i], *args, **kw), x)

    def attention(self, kv, il, q, k, v, pos0, scale, window=0):
        return self._per_sequence(
            lambda i, qi, ki, vi: self.ops.attention(self.kvs[i], il, qi, ki, vi, self.starts[i],
                                                     scale, window), q, k, v)

    def recurrent_state(self, kv, il, pos0, n_tokens):
        """Every sequence's (conv, delta-rule) state of layer il, as two lists."""
        r = self.rows
        got = [self.kvs[i].recurrent.take(il, self.starts[i], r[i + 1] - r[i])
               for i in range(len(self.starts))]
        return [c for c, _ in got], [s for _, s in got]

    def conv_silu(self, x, name, states):
        return self._per_sequence(lambda i, xi: self.ops.conv_silu(xi, name, states[i]), x)

    def delta_rule(self, q, k, v, g, beta, states, scale):
        return self._per_sequence(
            lambda i, *a: self.ops.delta_rule(*a, states[i], scale), q, k, v, g, beta)
