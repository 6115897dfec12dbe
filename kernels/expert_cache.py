"""The device-managed expert cache's two kernels (kernels/cuda/expert_cache.cu), their launchers
and NumPy twins; lite/backends/cuda_expert_dev.py keeps the cache's tables and calls them.

  expert_cache_step   one CTA of 512 threads (n_expert <= 512). Marks the routed experts of this call (ids
            on the device, any T <= 8 tokens x k), stamps the hits' slots with a new tick (clock,
            a device counter), and gives each miss (ascending expert order) the least recently
            stamped slot not stamped this tick (ties: the lower slot; free slots first), updating
            the (layer, expert) -> slot table, the slot -> key table and a fetch list
            [count, slot0, expert0, slot1, expert1, ...]; counts hits, misses and calls.
  expert_cache_fetch  copies each listed miss's gate, up and down bytes straight from the pinned host
            copies (host pointers are device-addressable under UVA: cudaHostAlloc memory) into its
            slot; blocks beyond the list's count exit at once, so a step with no miss costs two
            launches of idle blocks.

step_ref and fetch_ref are the contract: the CPU tests run the cache on them, the emulator and GPU
tests compare the kernels with them.
"""
import ctypes
import functools

import numpy as np

from lite.kernels.cuda_source import source

C_XC = source("expert_cache.cu")
STEP_THREADS = 512                 # expert_cache_step's CTA; also the most experts a layer may have
FETCH_BLOCKS = 32                # expert_cache_fetch blocks along an expert's bytes (per miss and kind)


@functools.lru_cache(maxsize=None)
def _module(device):
    import cupy
    return cupy.RawModule(code=C_XC, options=("--std=c++17",))


def step(ids, n_ids, row, n_expert, table, key, stamp, clock, fetch_list, counters):
    """expert_cache_step on the current CuPy stream (device int32 arrays; counters uint64)."""
    import cupy
    i32 = np.int32
    f = _module(cupy.cuda.runtime.getDevice()).get_function("expert_cache_step")
    f((1,), (STEP_THREADS,), (ids, i32(n_ids), i32(row), i32(n_expert), table, key, stamp, clock,
                            i32(stamp.size), fetch_list, counters))


def fetch(fetch_list, src, ebytes, bufs, n_ids):
    """expert_cache_fetch on the current CuPy stream: src, the layer's three device-addressable host
    pointers (gate, up, down); ebytes their bytes an expert; bufs the slots' device buffers."""
    import cupy
    f = _module(cupy.cuda.runtime.getDevice()).get_function("expert_cache_fetch")
    f((FETCH_BLOCKS, n_ids, 3), (256,), (fetch_list, *(np.uint64(p) for p in src),
                                         *(np.int64(eb) for eb in ebytes), *bufs))


def step_ref(ids, row, n_expert, table, key, stamp, clock, fetch_list, counters):
    """NumPy twin of expert_cache_step (the contract), in place on NumPy arrays: table (rows, n_expert),
    key/stamp (n_dev,), clock (1,), fetch_list (1 + 2 * max misses,), counters (3,) uint64."""
    v = np.asarray(ids).reshape(-1)
    need = np.zeros(n_expert, bool)
    need[v[(v >= 0) & (v < n_expert)]] = True
    t = int(clock[0]) + 1
    clock[0] = t
    trow = table[row]
    miss = []
    for e in np.flatnonzero(need):
        s = trow[e]
        if s >= 0:
            stamp[s] = t
        else:
            miss.append(int(e))
    for j, e in enumerate(miss):
        cand = np.flatnonzero(stamp != t)
        s = int(cand[np.argmin(stamp[cand])])          # first minimum: the lower slot
        old = int(key[s])
        if old >= 0:
            table.reshape(-1)[old] = -1
        key[s] = row * n_expert + e
        trow[e] = s
        stamp[s] = t
        fetch_list[1 + 2 * j] = s
        fetch_list[2 + 2 * j] = e
    fetch_list[0] = len(miss)
    counters[0] += np.uint64(int(need.sum()) - len(miss))
    counters[1] += np.uint64(len(miss))
    counters[2] += np.uint64(1)
    return miss


def fetch_ref(fetch_list, src, ebytes, bufs, n_ids):
    """The NumPy twin of expert_cache_fetch (CPU tests, where the "device" is host memory and src holds the
    pinned copies' host addresses): each listed miss's bytes into its slot."""
    for j in range(int(fetch_list[0])):
        slot, e = int(fetch_list[1 + 2 * j]), int(fetch_list[2 + 2 * j])
        for k, eb in enumerate(ebytes):
            ctypes.memmove(bufs[k].ctypes.data + slot * eb, src[k] + e * eb, eb)
