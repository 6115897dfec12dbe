"""A decode-time expert cache kept entirely on the device (--experts host).

Why: with the experts in host RAM, the host-managed cache (lite/backends/experts.py ExpertCache through
cuda_host_experts.HostExperts) must read each layer's routed ids on the host (one sync a layer),
run the cache's Python and launch the layer's kernels one by one: a decode step could not be
captured in a CUDA graph, and the syncs and eager launches, not the copies, bounded decode.

Here the cache's bookkeeping is one small kernel a layer and the misses' copies a second one, both
reading their inputs on the device (kernels/expert_cache.py), so a decode step has no host round
trip and is captured in the stage's decode graph with the rest of the model. The grouped pairs
path then reads the slots through the layer's row of the table (its slot_of): each output row is
computed on its own from the same bytes as when resident, so outputs are byte-identical whatever
the cache holds.

Slots here are apart from the host-managed cache's (which serves prefill chunks: they route to
nearly every expert and are better served by whole layers), so the two never disagree about what
a slot holds.
"""
import numpy as np

from lite.kernels import expert_cache as kx

MAX_EXPERTS = kx.STEP_THREADS    # the most experts a layer may have (a thread of the step's CTA each)


class DeviceExpertCache:
    """n_dev slots of one pool layout on the device, managed by expert_cache_step. layers: the pool's layers
    (a table row each); ebytes: bytes of one expert of gate, up, down; src_ptr(layer, kind) -> a
    device-addressable pointer to that layer's tensor in pinned host RAM. launch: None for the
    CUDA kernels, else a (step, fetch) pair with kernels/expert_cache.py's step_ref and fetch_ref
    signatures (the CPU tests' NumPy twins)."""

    def __init__(self, cp, n_dev, layers, n_expert, ebytes, src_ptr, max_ids, launch=None):
        if n_expert > MAX_EXPERTS:
            raise ValueError(f"device expert cache: {n_expert} experts (at most {MAX_EXPERTS})")
        if n_dev < max_ids:
            raise ValueError(f"device expert cache: {n_dev} slots for up to {max_ids} routed experts")
        self.cp, self.n_dev, self.n_expert, self.ebytes = cp, n_dev, n_expert, list(ebytes)
        self.max_ids = max_ids
        self.row = {il: i for i, il in enumerate(sorted(layers))}
        self.bufs = [cp.empty(n_dev * eb, np.uint8) for eb in self.ebytes]
        self.table = self._full((len(self.row), n_expert), -1)
        self.key = self._full((n_dev,), -1)
        self.stamp = self._full((n_dev,), -1)
        self.clock = self._full((1,), 0)
        self.fetch = self._full((1 + 2 * max_ids,), 0)
        self.counters = cp.zeros(3, np.uint64)
        self._src = {il: [int(src_ptr(il, k)) for k in range(3)] for il in self.row}
        self._launch = launch
        self.calls = 0                   # step() calls from Python (replays of a graph not counted)

    def _full(self, shape, v):
        a = self.cp.empty(int(np.prod(shape)), np.int32).reshape(shape)
        a[...] = v
        return a

    def slot_of(self, il):
        """The layer's expert -> slot array (-1: not resident), the grouped kernels' slot_of."""
        return self.table[self.row[il]]

    def step(self, ids, il, stream=None):
        """Make layer il's routed experts (ids: device int32, any shape, <= max_ids entries)
        resident: bookkeeping and copies on the device, in stream order; no host sync."""
        n_ids = int(np.prod(ids.shape))
        if n_ids > self.max_ids:
            raise ValueError(f"device expert cache: {n_ids} routed experts (at most {self.max_ids})")
        row = self.row[il]
        self.calls += 1
        src = self._src[il]
        if self._launch is not None:
            step, fetch = self._launch
            step(ids, row, self.n_expert, self.table, self.key, self.stamp, self.clock, self.fetch, self.counters)
            fetch(self.fetch, src, self.ebytes, self.bufs, n_ids)
            return
        kx.step(ids, n_ids, row, self.n_expert, self.table, self.key, self.stamp, self.clock, self.fetch,
                self.counters)
        kx.fetch(self.fetch, src, self.ebytes, self.bufs, n_ids)

    def stats(self):
        """hits, misses, steps (kernel calls, graph replays included), bytes streamed: one small
        device-to-host read (call outside the hot path)."""
        c = self.counters
        c = c.get() if hasattr(c, "get") else np.asarray(c)
        hits, misses, steps = (int(x) for x in c)
        return {"hits": hits, "misses": misses, "steps": steps, "bytes_streamed": misses * sum(self.ebytes)}

    def contents(self):
        """{(layer, expert): slot} as the device tables say (tests)."""
        key = self.key.get() if hasattr(self.key, "get") else np.asarray(self.key)
        layers = sorted(self.row, key=self.row.get)
        return {(layers[int(k) // self.n_expert], int(k) % self.n_expert): s for s, k in enumerate(key) if k >= 0}

