"""Experts kept off the GPU (--experts host|mmap): the device side of lite/backends/experts.py.

Dense weights and the KV cache stay on the device; each layer's three expert tensors live in pinned
host RAM (host: one pinned copy of the file's bytes, so copies are true async DMA) or stay in the
file's mapped pages (mmap: through lite.backends.experts.Stager's two pinned buffers). A GPU cache of slots
(lite.backends.experts.ExpertCache, least recently used out) serves them: a layer's routed experts are copied
on a copy stream into free or evicted slots, the compute stream waits on the copies' events (on the
device; the host does not block), and the grouped kernels read the slots through slot_of. A layer
whose routed experts outnumber the slots runs in rounds; each round writes only its experts' rows,
so outputs are byte-identical to all-on-GPU whatever the cache size (tests/test_experts.py).

Layers whose expert tensors differ in type or shape get a pool of slots each; the cache bytes are
split between pools by their number of layers. Within a pool, decode (T <= 8) goes through a cache
managed on the device (cuda_expert_dev.py: no host sync, graph-captured) when the budget leaves it
enough slots; prefill chunks through the host-managed one, large chunks without reading their ids.
"""
import time

import numpy as np

from lite.backends.cuda_expert_dev import MAX_EXPERTS, DeviceExpertCache
from lite.backends.experts import ExpertCache, Stager, run_layer

KINDS = ("gate", "up", "down")
STAGING_BYTES = 64 << 20        # each of mmap mode's two pinned staging buffers
DEV_MIN_SLOTS = 64              # below this the device cache is not worth its slots
DEV_MAX_IDS = 128               # routed experts one device-cache step takes (T x k)


class StreamedWeight:
    """What the grouped path needs of an expert tensor that is not on the device."""
    __slots__ = ("name", "qtype", "shape", "data", "ebytes")

    def __init__(self, name, qtype, shape, ebytes):
        self.name, self.qtype, self.shape, self.data, self.ebytes = name, qtype, tuple(shape), None, ebytes


class SlotWeight:
    """One expert's 2-D weight in a cache slot (the per-expert loop's products read it)."""
    __slots__ = ("name", "qtype", "shape", "data")

    def __init__(self, name, qtype, shape, data):
        self.name, self.qtype, self.shape, self.data = name, qtype, tuple(shape), data


class _Handle:
    """A queued copy; its event (on the copy stream) is set when its batch is issued."""
    __slots__ = ("event",)

    def __init__(self):
        self.event = None


class _Pool:
    """n_slots slots of one layout: a device buffer per tensor kind, one expert a slot. dev: a
    cuda_expert_dev.DeviceExpertCache of more slots of this layout (decode), or None."""

    def __init__(self, cp, ebytes, n_slots, copy, wait, retain, layers):
        self.ebytes = ebytes
        self.n_slots = n_slots
        self.dev = None
        self.bufs = [cp.empty(n_slots * eb, np.uint8) for eb in ebytes]
        # layers in forward order: evict the expert whose layer comes back last (lite/backends/experts.py)
        self.cache = ExpertCache(n_slots, lambda il, e, s, after: copy(self, il, e, s, after), wait,
                                 lambda il: sum(ebytes), retain=retain, layers=layers)


class HostExperts:
    """The experts of a stage's layers, off the device, served through a GPU slot cache.
    names: the stage's blk.N.ffn_{gate,up,down}_exps.weight tensors. cache_bytes: the slots' VRAM
    (n_slots, when given, overrides it: the tests' one-expert cache). retain False: --expert-cache
    off (slots are staging only, forgotten after each layer).
    The BackendConfig expert_* settings, as arguments: prefetch (copy the next layer's likely
    experts while this layer computes; outputs are byte-identical either way), device_cache
    (decode from a cache managed on the device: no host sync, graph-captured), prefill_share (the
    share of a pool's slots left to the host-managed cache, which serves prefill; the rest is the
    device cache), full_layer (a chunk with at least that many token-slots an expert makes the
    layer's experts resident whole, without reading the ids on the host; 0: never)."""

    def __init__(self, backend, gguf, names, mode, cache_bytes, retain=True, n_slots=None, dev_slots=None,
                 dev_launch=None, prefetch=True, device_cache=True, prefill_share=0.5, full_layer=16):
        import cupyx
        cp = self.cp = backend.cp
        self.backend, self.mode = backend, mode
        self.pairs_max_tokens = backend.moe_pairs_max_tokens    # decode: the products over pairs
        self.prefetch, self.full_layer = prefetch, full_layer
        by_layer = {}
        for n in names:
            il, kind = int(n.split(".")[1]), n.split(".")[2][len("ffn_"):-len("_exps")]
            by_layer.setdefault(il, {})[kind] = n
        self.weights, self.src, layouts = {}, {}, {}
        for il, d in sorted(by_layer.items()):
            ts = [gguf.tensors[d[k]] for k in KINDS]
            self.weights[il] = [StreamedWeight(d[k], t.type_name, t.shape, t.nbytes // t.shape[0])
                                for k, t in zip(KINDS, ts)]
            if mode == "host":       # pinned copies: the DMA engine reads them while the GPU computes
                self.src[il] = []
                for t in ts:
                    buf = cupyx.empty_pinned(t.nbytes, np.uint8)
                    np.copyto(buf, t.raw.reshape(-1))
                    self.src[il].append(buf)
            else:
                self.src[il] = [t.raw.reshape(-1) for t in ts]
            layouts.setdefault(tuple((w.qtype, w.shape, w.ebytes) for w in self.weights[il]), []).append(il)
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self.stager = None
        if mode == "mmap":
            pinned = [cupyx.empty_pinned(STAGING_BYTES, np.uint8) for _ in range(2)]
            self.stager = Stager(STAGING_BYTES, lambda i, s, off, n: np.copyto(pinned[i][:n], s[off:off + n]),
                                 lambda i, d, off, n: self._upload(d[off:off + n], pinned[i][:n]),
                                 lambda ev: ev.synchronize())
        self._queue = []             # copies asked for and not yet issued (_flush)
        self._last_wait = None
        self._waits = []             # (before, after) events around the compute stream's waits
        self._gpu_wait_s = 0.0
        self.pool_of = {}
        for layout, ils in layouts.items():
            ebytes = [eb for _, _, eb in layout]
            n_expert = layout[0][1][0]
            k = n_slots or max(1, int(cache_bytes * len(ils) / len(by_layer)) // sum(ebytes))
            n_dev = self._dev_split(k, n_expert, mode, retain, n_slots, dev_slots, device_cache, prefill_share)
            if n_dev and n_slots is None and dev_slots is None:
                k -= n_dev                   # the budget's rest stays with the host-managed cache
            pool = _Pool(cp, ebytes, k, self._copy, self._wait, retain, sorted(ils))
            if n_dev:
                pool.dev = DeviceExpertCache(cp, n_dev, ils, n_expert, ebytes,
                                             lambda il, kd: self.src[il][kd].ctypes.data,
                                             min(n_dev, DEV_MAX_IDS), launch=dev_launch)
            for il in ils:
                self.pool_of[il] = pool
        self.pools = list({id(p): p for p in self.pool_of.values()}.values())
        self._last = {}              # layer -> the experts it routed to last time (prefetch's guess)
        # host-side counters (lite bench --verbose): calls of each path, host syncs, host seconds
        self.prof = {"host_calls": 0, "host_syncs": 0, "host_s": 0.0, "full_layers": 0, "dev_calls": 0,
                     "dev_host_s": 0.0}

    @staticmethod
    def _dev_split(k, n_expert, mode, retain, n_slots, dev_slots, device_cache=True, prefill_share=0.5):
        """Slots of a pool's budget k that go to the device cache (decode): dev_slots when given
        (tests), none with n_slots given, device_cache off, mmap (no pinned source to read from),
        --expert-cache off, more experts than expert_cache_step takes, or too few slots; else what
        prefill_share leaves (at least two layers' experts stay with the host-managed cache)."""
        if dev_slots is not None:
            return dev_slots
        if n_slots is not None or not device_cache or mode != "host" or not retain or n_expert > MAX_EXPERTS:
            return 0
        n_host = max(min(k, 2 * n_expert), int(k * prefill_share))
        return k - n_host if k - n_host >= DEV_MIN_SLOTS else 0

    def graph_safe(self):
        """Is every layer's decode served by a device cache (no host sync, capturable)?"""
        return all(p.dev is not None for p in self.pools)

    def serves(self, il):
        return il in self.pool_of

    # --- copies (copy stream) and waits (compute stream) -------------------------------------
    # The cache asks for one expert at a time; the copies are queued and issued together at the
    # first wait (or after a prefetch): one cudaMemcpyAsync a run of consecutive experts going to
    # consecutive slots, and one event for the batch, so a prefill layer that misses 128 experts
    # costs a few calls, not 384 (each a Python call's host time).
    def _memcpy(self, dst_ptr, src, nbytes):
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(dst_ptr, src.ctypes.data, nbytes, rt.memcpyHostToDevice, self.copy_stream.ptr)

    def _upload(self, dst, src):
        self._memcpy(dst.data.ptr, src, src.nbytes)
        return self.copy_stream.record()

    def _copy(self, pool, il, e, slot, after):
        """Queue filling `slot` of pool with expert e of layer il once `after` (the last compute
        that read the slot) is done; returns a handle whose event is set when the batch is issued."""
        h = _Handle()
        self._queue.append((pool, il, e, slot, after, h))
        return h

    def _flush(self):
        q, self._queue = self._queue, []
        if not q:
            return
        cs = self.copy_stream
        for after in {id(t[4]): t[4] for t in q if t[4] is not None}.values():
            cs.wait_event(after)
        q.sort(key=lambda t: (id(t[0]), t[1], t[2]))
        i = 0
        while i < len(q):
            pool, il, e0, s0 = q[i][:4]
            n = 1
            while (i + n < len(q) and q[i + n][0] is pool and q[i + n][1] == il
                   and q[i + n][2] == e0 + n and q[i + n][3] == s0 + n):
                n += 1
            for k, eb in enumerate(pool.ebytes):
                src = self.src[il][k][e0 * eb:(e0 + n) * eb]
                if self.stager is None:
                    self._memcpy(pool.bufs[k].data.ptr + s0 * eb, src, n * eb)
                else:
                    self.stager.copy(src, pool.bufs[k][s0 * eb:(s0 + n) * eb], n * eb)
            i += n
        ev = cs.record()
        for t in q:
            t[5].event = ev

    def _wait(self, h):
        """The compute stream waits for a copy on the device; events around the wait measure how
        long the GPU sat idle for it (read by stats())."""
        if h.event is None:
            self._flush()
        if h.event is self._last_wait:
            return                           # the batch's one event: waited for already
        self._last_wait = h.event
        st = self.backend.stream
        before = st.record()
        st.wait_event(h.event)
        self._waits.append((before, st.record()))
        if len(self._waits) > 4096:
            self._settle()

    def _settle(self):
        cp = self.cp
        for a, b in self._waits:
            b.synchronize()
            self._gpu_wait_s += cp.cuda.get_elapsed_time(a, b) / 1e3
        self._waits = []

    # --- the MoE of one layer ------------------------------------------------------------------
    def moe_experts(self, be, h, il, ids, weights, act):
        """As CUDAExperts.moe_experts, the experts from the slots. Decode (T <= pairs_max_tokens,
        fused types) with a device cache: no host sync (_moe_dev). Otherwise the host-managed cache:
        the host reads the routed ids (one sync a layer: which experts to copy depends on them),
        except for chunks large enough to use nearly every expert, which make the whole layer
        resident without reading them."""
        cp = self.cp
        pool, ws = self.pool_of[il], self.weights[il]
        h = cp.ascontiguousarray(h, dtype=np.float32)
        ids = cp.ascontiguousarray(cp.asarray(ids), dtype=np.int32)
        weights = cp.ascontiguousarray(cp.asarray(weights), dtype=np.float32)
        dev = pool.dev
        if dev is not None and ids.shape[0] <= self.pairs_max_tokens and ids.size <= dev.max_ids:
            t0 = time.perf_counter()
            plan = be.moe_plan(ids, ws, bases=dev.bufs)
            if plan["path"] == "pairs":
                out = self._moe_dev(be, dev, plan, h, il, ids, weights, act)
                self.prof["dev_calls"] += 1
                self.prof["dev_host_s"] += time.perf_counter() - t0
                return out
        t0 = time.perf_counter()
        try:
            return self._moe_host(be, pool, ws, h, il, ids, weights, act)
        finally:
            self.prof["host_calls"] += 1
            self.prof["host_s"] += time.perf_counter() - t0

    def _moe_dev(self, be, dev, plan, h, il, ids, weights, act):
        """The device cache's step (bookkeeping + the misses' copies, on the device), the pairs
        path reading the slots through the layer's table row, one combine: capturable."""
        dev.step(ids, il)
        y = be.moe_products(plan, h, ids, self.weights[il], act, bases=dev.bufs, slot_of=dev.slot_of(il))
        return be.moe_combine(y, None, weights)

    def _moe_host(self, be, pool, ws, h, il, ids, weights, act):
        cp = self.cp
        n_expert = ws[0].shape[0]
        plan = be.moe_plan(ids, ws, bases=pool.bufs)
        T = ids.shape[0]
        full = (self.full_layer > 0 and T > self.pairs_max_tokens and plan["path"] == "gemm"
                and ids.size >= self.full_layer * n_expert and pool.cache.n_slots >= 2 * n_expert)
        if full:                     # the whole layer: no need to read the ids (no sync)
            ids_h, route = None, np.arange(n_expert)
            self.prof["full_layers"] += 1
        else:
            ids_h = route = cp.asnumpy(ids)
            self.prof["host_syncs"] += 1
        state = {"y": None}
        # Few tokens of a type without a fused grouped kernel: the per-expert loop, as on the device
        per_expert = T <= self.pairs_max_tokens and plan["path"] != "pairs"

        def compute(rnd):
            if per_expert:
                state["y"] = be.moe_per_expert(h, il, ids, weights, act, self._slot_weight(pool, ws, rnd),
                                                ids_h=ids_h, y=state["y"], experts=rnd.experts, combine=False)
                return be.stream.record()
            slot_of = cp.asarray(np.array(rnd.slot_of(n_expert), np.int32))
            state["y"] = be.moe_products(plan, h, ids, ws, act, bases=pool.bufs, slot_of=slot_of,
                                     y=state["y"], rnd=rnd)
            return be.stream.record()

        run_layer(pool.cache, il, route, compute)
        self._last[il] = np.unique(route)
        if self.prefetch:
            self._prefetch(il)
        return be.moe_combine(state["y"], None if per_expert else plan.get("pos"), weights)

    @staticmethod
    def _slot_weight(pool, ws, rnd):
        """(expert, kind) -> the 2-D weight of that expert in its slot this round."""
        slot_of = dict(zip(rnd.experts, rnd.slots))

        def weight_of(e, kind):
            i = KINDS.index(kind)
            w, eb, s = ws[i], pool.ebytes[i], slot_of[e]
            return SlotWeight(w.name, w.qtype, w.shape[1:], pool.bufs[i][s * eb:(s + 1) * eb])
        return weight_of

    def _prefetch(self, il):
        """Start copying layer il+1's likely experts (those it routed to last time, else the ones
        il just used) into slots not holding il's or il+1's; the copies wait for the computes that
        still read those slots, and overlap with this layer's MoE and the next one's attention."""
        nxt = il + 1
        if nxt not in self.pool_of:
            return
        guess = self._last.get(nxt, self._last[il])
        self.pool_of[nxt].cache.prefetch(nxt, guess.tolist(), keep_layer=il)
        self._flush()                        # start them now, while this layer computes

    # --- counters --------------------------------------------------------------------------------
    def stats(self):
        """Counters over all pools (lite bench --verbose): hits, misses, bytes streamed, the host's
        and the GPU's time waiting for copies, evictions, rounds, slots."""
        self._settle()
        tot = {}
        for p in self.pools:
            for k, v in p.cache.stats.as_dict().items():
                if k != "hit_rate":
                    tot[k] = tot.get(k, 0) + v
        n = tot.get("hits", 0) + tot.get("misses", 0)
        tot["hit_rate"] = round(tot.get("hits", 0) / n, 4) if n else 0.0
        tot["gpu_wait_s"] = round(self._gpu_wait_s, 4)
        # the device caches (decode): their hits, misses and bytes count in the totals too
        dev = {"dev_hits": 0, "dev_misses": 0, "dev_steps": 0, "dev_bytes": 0}
        for p in self.pools:
            if p.dev is not None:
                d = p.dev.stats()
                dev["dev_hits"] += d["hits"]
                dev["dev_misses"] += d["misses"]
                dev["dev_steps"] += d["steps"]
                dev["dev_bytes"] += d["bytes_streamed"]
        tot["hits"] = tot.get("hits", 0) + dev["dev_hits"]
        tot["misses"] = tot.get("misses", 0) + dev["dev_misses"]
        tot["bytes_streamed"] = tot.get("bytes_streamed", 0) + dev["dev_bytes"]
        n = tot["hits"] + tot["misses"]
        tot["hit_rate"] = round(tot["hits"] / n, 4) if n else 0.0
        tot.update(dev)
        tot["dev_slots"] = sum(p.dev.n_dev for p in self.pools if p.dev is not None)
        tot["slots"] = sum(p.n_slots for p in self.pools) + tot["dev_slots"]
        tot["cache_bytes"] = sum((p.n_slots + (p.dev.n_dev if p.dev else 0)) * sum(p.ebytes) for p in self.pools)
        # host time: the host-managed path per call (Python, its one sync a layer included) and
        # the device path's Python per eager call (graph replays run none of it)
        pr = dict(self.prof)
        pr["host_ms_per_call"] = round(1e3 * pr["host_s"] / pr["host_calls"], 4) if pr["host_calls"] else 0.0
        pr["host_s"] = round(pr["host_s"], 4)
        pr["dev_host_s"] = round(pr["dev_host_s"], 4)
        tot.update(pr)
        tot["mode"] = self.mode
        return tot
