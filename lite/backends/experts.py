"""Expert residency and the GPU expert cache (docs/design.md "Experts"; the interface: docs/experts.md).

`--experts gpu|host|mmap|auto` says where the 3-D expert tensors live: in VRAM with the dense weights
(gpu), in pinned host RAM (host), or in the file's mapped pages (mmap, when RAM is short).
`--expert-cache auto|<GiB>|<N>%|off` sizes the GPU cache that serves host/mmap experts. A cache *slot*
holds one expert of one layer (its gate, up and down rows); an ExpertCache manages the slots of one
pool whose slots all have one layout (layers whose expert tensors differ in type or shape get a
pool each).

Everything here is pure Python: the cache's logic (LRU, counters, planning rounds, slot assignment)
never touches a device; copies go through an injected `copy(layer, expert, slot, after)` that returns
a handle (a CUDA event on the GPU), `wait(handle)` blocks on one, and the host-to-device path of
mmap'd experts goes through `Stager`, two staging buffers used in turn. The tests drive it with
NumPy arrays as the "device".

A layer whose routed experts outnumber the slots is computed in *rounds*: each round makes up to
n_slots experts resident and computes only the token-slots routed to them (writing their rows of
one output buffer), and the weighted combine runs once after the last round; so results are the same
byte for byte whatever the cache size.
"""
import dataclasses
import re
import time
from collections import OrderedDict

import numpy as np

GiB = 1 << 30
MODES = ("gpu", "host", "mmap", "auto")
# Fractions of what is free that auto may take: room for activations, scratch and the allocator.
VRAM_USE = 0.9
PINNED_USE = 0.75


@dataclasses.dataclass(frozen=True)
class Residency:
    mode: str            # "gpu" | "host" | "mmap"
    cache_bytes: int     # the GPU expert cache; 0 with mode "gpu", or with --expert-cache off


@dataclasses.dataclass(frozen=True)
class Share:
    """--expert-cache N%: that share of the model's expert bytes (resolve() turns it into bytes)."""
    frac: float


def parse_cache(value):
    """--expert-cache: "auto" -> "auto", "off" -> 0, "<GiB>" (e.g. "12", "7.5") -> bytes,
    "<N>%" (e.g. "25%", 0 < N <= 100) -> Share(N / 100) of the experts."""
    v = str(value).strip().lower()
    if v in ("auto", "off"):
        return 0 if v == "off" else "auto"
    m = re.fullmatch(r"(\d+(\.\d+)?)%", v)
    if m and 0 < float(m.group(1)) <= 100:
        return Share(float(m.group(1)) / 100)
    if not re.fullmatch(r"\d+(\.\d+)?", v):
        raise ValueError(f"--expert-cache must be auto, off, a size in GiB (e.g. 12) or a share of the "
                         f"experts (e.g. 25%), got {value!r}")
    return int(float(v) * GiB)


def resolve(experts, expert_cache, expert_bytes, free_vram, free_host, slot_bytes, layer_bytes=0):
    """Where experts live and how big the cache is. free_vram: what is left on the device after the
    dense weights and the KV cache; free_host: available RAM; layer_bytes: one layer's experts. A
    pure function, tested on the CPU. The cache never gets less than two layers' experts (when
    the VRAM allows): with fewer slots a prefill chunk, which routes to nearly every expert, would
    run a layer in many rounds, each a full batched GEMM; the second layer is the staging that the
    next layer's copies fill while this one computes."""
    if experts not in MODES:
        raise ValueError(f"--experts must be one of {', '.join(MODES)}, got {experts!r}")
    cache = parse_cache(expert_cache)
    if experts == "auto":
        if expert_bytes <= VRAM_USE * free_vram:
            experts = "gpu"
        elif expert_bytes <= PINNED_USE * free_host:
            experts = "host"
        else:
            experts = "mmap"
    if experts == "gpu":
        return Residency("gpu", 0)
    if cache == "auto":
        cache = int(min(expert_bytes, VRAM_USE * free_vram))
    elif isinstance(cache, Share):
        cache = int(cache.frac * expert_bytes)
    # At least two slots (one being computed while the next is filled), and two layers' experts
    # as staging where the VRAM allows it.
    floor = max(2 * slot_bytes, min(2 * layer_bytes, int(VRAM_USE * free_vram)))
    return Residency(experts, max(cache, floor))


@dataclasses.dataclass
class CacheStats:
    hits: int = 0            # routed (layer, expert) already resident (or already on its way)
    misses: int = 0          # had to be copied in
    bytes_streamed: int = 0
    wait_s: float = 0.0      # host time blocked on copies
    evictions: int = 0
    rounds: int = 0          # layer computations; more than layers when experts outnumber slots
    prefetched: int = 0

    def hit_rate(self):
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def as_dict(self):
        return {**dataclasses.asdict(self), "hit_rate": round(self.hit_rate(), 4)}


@dataclasses.dataclass(frozen=True)
class Round:
    layer: int
    experts: tuple       # experts computed in this round, ascending
    slots: tuple         # their slots, same order

    def slot_of(self, n_expert):
        """expert -> slot for this round, -1 elsewhere (the kernels' slot_of array)."""
        m = [-1] * n_expert
        for e, s in zip(self.experts, self.slots):
            m[e] = s
        return m


class ExpertCache:
    """A cache of n_slots expert slots. copy(layer, expert, slot, after) starts filling a slot once
    `after` (a handle from compute, or None) is done and returns a handle; wait(handle) blocks on it.
    expert_bytes(layer) is what one miss moves. retain=False (--expert-cache off) forgets every slot
    after its layer's rounds, so every use is a miss.

    Eviction: least recently used, or, given `layers` (the layers this cache serves, in the order a
    forward pass visits them), the expert of the layer whose next turn is furthest away (the layer
    just computed, then the one before...; LRU within a layer). A forward pass sweeps the layers in
    a cycle, and under LRU a prefill chunk, which needs nearly all of every layer's experts, would
    evict each expert just before its next use: no hit at all whatever the cache size. Evicting by
    next turn keeps a fixed share of the layers resident instead (a cache of half the experts: half
    the uses hit)."""

    def __init__(self, n_slots, copy, wait, expert_bytes, retain=True, clock=time.perf_counter, layers=None):
        if n_slots < 1:
            raise ValueError(f"an expert cache needs at least one slot, got {n_slots}")
        self.n_slots = n_slots
        self._copy, self._wait, self._bytes, self.retain, self._clock = copy, wait, expert_bytes, retain, clock
        self._lru = OrderedDict()            # (layer, expert) -> slot, least recently used first
        self._order = list(layers) if layers is not None else None
        self._turn = {l_: i for i, l_ in enumerate(self._order or [])}
        self._by_layer = {}                  # layer -> OrderedDict of its resident keys, LRU first
        self._free = list(range(n_slots - 1, -1, -1))
        self._ready = {}                     # slot -> handle of the copy that fills it
        self._busy = {}                      # slot -> handle of the last compute reading it
        self.stats = CacheStats()

    # --- queries ------------------------------------------------------------------------------
    def resident(self, layer, expert):
        return (layer, expert) in self._lru

    def contents(self):
        """{(layer, expert): slot}, least recently used first."""
        return dict(self._lru)

    # --- slot assignment ----------------------------------------------------------------------
    def _victims(self, layer):
        """Resident keys in eviction order for a load into `layer`."""
        if self._order is None or layer not in self._turn:
            yield from self._lru
            return
        n, t = len(self._order), self._turn[layer]
        for d in range(1, n + 1):            # the layer just before `layer` comes back last
            yield from self._by_layer.get(self._order[(t - d) % n], ())
        yield from (k for k in self._lru if k[0] not in self._turn)

    def _forget(self, key):
        slot = self._lru.pop(key, None)
        if slot is not None:
            self._by_layer[key[0]].pop(key, None)
        return slot

    def _take_slot(self, pinned, layer):
        """A free slot, else the first victim not pinned (needed by the current round)."""
        if self._free:
            return self._free.pop()
        for key in self._victims(layer):
            if key not in pinned:
                self.stats.evictions += 1
                return self._forget(key)
        raise RuntimeError("expert cache: every slot is pinned by the current round")

    def _load(self, layer, expert, pinned):
        slot = self._take_slot(pinned, layer)
        self._ready[slot] = self._copy(layer, expert, slot, self._busy.get(slot))
        self._lru[(layer, expert)] = slot
        self._by_layer.setdefault(layer, OrderedDict())[(layer, expert)] = slot
        self.stats.bytes_streamed += self._bytes(layer)
        return slot

    def plan(self, layer, experts):
        """Split a layer's routed experts into rounds of at most n_slots; resident ones first, so a
        round never evicts an expert that a later round of this layer would hit."""
        need = sorted(set(int(e) for e in experts))
        hits = [e for e in need if (layer, e) in self._lru]
        order = hits + [e for e in need if (layer, e) not in self._lru]
        return [order[i:i + self.n_slots] for i in range(0, len(order), self.n_slots)]

    def acquire(self, layer, experts):
        """Make one round's experts resident (copies started, then waited for) -> Round."""
        pinned = {(layer, e) for e in experts}
        slots = []
        for e in experts:
            key = (layer, e)
            if key in self._lru:
                self._lru.move_to_end(key)
                self._by_layer[layer].move_to_end(key)
                self.stats.hits += 1
                slots.append(self._lru[key])
            else:
                self.stats.misses += 1
                slots.append(self._load(layer, e, pinned))
        t0 = self._clock()
        for s in slots:
            h = self._ready.pop(s, None)
            if h is not None:
                self._wait(h)
        self.stats.wait_s += self._clock() - t0
        self.stats.rounds += 1
        order = sorted(range(len(experts)), key=lambda i: experts[i])
        return Round(layer, tuple(experts[i] for i in order), tuple(slots[i] for i in order))

    def release(self, rnd, done=None):
        """The round's compute was enqueued; `done` (a handle) must finish before its slots refill."""
        for s in rnd.slots:
            if done is not None:
                self._busy[s] = done
        if not self.retain:
            for e, s in zip(rnd.experts, rnd.slots):
                if self._forget((rnd.layer, e)) is not None:
                    self._free.append(s)

    def prefetch(self, layer, experts, keep_layer=None, limit=None):
        """Start copying a coming layer's likely experts (e.g. those it used for the previous
        chunk) into free or least recently used slots, never taking one that holds keep_layer's
        (the layer being computed) or this layer's own; they count as hits when it is acquired.
        A slot still read by a compute is refilled only after it (the copy's `after`)."""
        keep = {k for k in self._lru if k[0] in (layer, keep_layer)}
        started = 0
        for e in sorted(set(int(e) for e in experts)):
            if limit is not None and started >= limit:
                break
            if (layer, e) in self._lru:
                continue
            if not self._free and len(keep) >= len(self._lru):     # every resident one is kept
                break
            self._load(layer, e, keep)
            keep.add((layer, e))
            self.stats.prefetched += 1
            started += 1
        return started


def run_layer(cache, layer, ids, compute):
    """Compute a MoE layer through the cache: for each round, compute(rnd) enqueues the rows of the
    token-slots routed to rnd.experts (from rnd's slots) and returns a handle (or None) that says
    when it has stopped reading them. The caller combines once, after this returns."""
    for experts in cache.plan(layer, np.asarray(ids).reshape(-1).tolist()):
        rnd = cache.acquire(layer, experts)
        cache.release(rnd, compute(rnd))


class Stager:
    """Host-to-device copies of unpinned bytes (mmap'd experts) through n_buffers pinned buffers
    used in turn: buffer i is refilled only after its previous upload finished, so the host fills
    one while the device reads the other. fill(i, src, off, n) copies src[off:off+n] into buffer i;
    upload(i, dst, off, n) starts the copy of its first n bytes to dst[off:] and returns a handle;
    wait(handle) blocks. Buffers hold buffer_bytes each."""

    def __init__(self, buffer_bytes, fill, upload, wait, n_buffers=2):
        self.buffer_bytes = buffer_bytes
        self._fill, self._upload, self._wait = fill, upload, wait
        self._pending = [None] * n_buffers
        self._next = 0
        self.uploads = 0

    def copy(self, src, dst, nbytes):
        """Start moving nbytes of src to dst; returns the handle of the last upload."""
        h = None
        for off in range(0, nbytes, self.buffer_bytes):
            n = min(self.buffer_bytes, nbytes - off)
            i = self._next
            if self._pending[i] is not None:
                self._wait(self._pending[i])
            self._fill(i, src, off, n)
            h = self._pending[i] = self._upload(i, dst, off, n)
            self._next = (i + 1) % len(self._pending)
            self.uploads += 1
        return h
