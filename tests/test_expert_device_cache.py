"""The decode-time expert cache managed on the device (lite/backends/cuda_expert_dev.py) and the
host-managed path's prefill without syncs: on the CPU through a fake CuPy (tests/fake_cupy.py's
HostCupy) and the kernels' NumPy twins, on the GPU the kernels against the twins (skipped elsewhere);
the kernels' CUDA C (kernels/expert_cache.py: expert_cache_step, expert_cache_fetch) also on the host
through tests/cuda_c_emulator.py against the twin (needs g++)."""
import types

import numpy as np
import pytest

import cuda_c_emulator as emu
from fake_cupy import HostCupy as FakeCupy

from lite.backends import cuda_expert_dev as xd
from lite.files.gguf_file import GGUFFile
from lite.kernels import expert_cache as kx
from test_expert_residency import needs_gpu, tiny_moe  # noqa: F401  (tiny_moe: the fixture, shared)


# --- the device-managed decode cache (lite/backends/cuda_expert_dev.py) and the host path's prefill
# without syncs; tiny_moe and needs_gpu are test_expert_residency.py's ---
def _host_experts(monkeypatch, path, **kw):
    import sys
    from lite.backends import cuda_host_experts as hx_mod
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(empty_pinned=lambda n, dt: np.zeros(n, dt)))
    monkeypatch.setattr(FakeCupy, "no_sync", False)
    g = GGUFFile(path)
    names = [n for n in g.tensors if n.endswith("_exps.weight")]
    be = types.SimpleNamespace(cp=FakeCupy, stream=FakeCupy.cuda.Stream(), moe_pairs_max_tokens=8)
    kw.setdefault("dev_launch", (kx.step_ref, kx.fetch_ref))
    return g, be, hx_mod.HostExperts(be, g, names, "host", kw.pop("cache_bytes", 0), **kw)


def _expert_bytes(g, il, e, k, eb):
    from lite.backends.cuda_host_experts import KINDS
    return g.tensors[f"blk.{il}.ffn_{KINDS[k]}_exps.weight"].raw.reshape(-1)[e * eb:(e + 1) * eb]


class LRUModel:
    """What expert_cache_step must do, said differently: least recently used slot out (free ones first, then
    the lower slot), the experts of one call never evicting each other."""

    def __init__(self, n):
        self.slot_of, self.last, self.tick = {}, [-1] * n, 0

    def step(self, layer, ids):
        self.tick += 1
        need = sorted(set(int(e) for e in np.asarray(ids).reshape(-1)))
        miss = [e for e in need if (layer, e) not in self.slot_of]
        for e in need:
            if (layer, e) in self.slot_of:
                self.last[self.slot_of[(layer, e)]] = self.tick
        for e in miss:
            s = min((v, s) for s, v in enumerate(self.last) if v != self.tick)[1]
            self.slot_of = {k: v for k, v in self.slot_of.items() if v != s}
            self.slot_of[(layer, e)] = s
            self.last[s] = self.tick
        return len(need) - len(miss), len(miss)


@pytest.mark.parametrize("n_dev", [16, 24, 64])
def test_device_cache_twin_keeps_the_right_bytes(tiny_moe, monkeypatch, n_dev):
    """step_ref + fetch_ref (the kernels' contract) through HostExperts' device cache: after each
    step every routed expert's slot holds its bytes, the tables agree, counts follow LRU."""
    g, be, hx = _host_experts(monkeypatch, tiny_moe, dev_slots=n_dev)
    pool = hx.pools[0]
    dev = pool.dev
    assert dev is not None and dev.n_dev == n_dev and hx.graph_safe()
    n_expert = hx.weights[0][0].shape[0]
    rng = np.random.default_rng(n_dev)
    model, hits, misses = LRUModel(n_dev), 0, 0
    for step in range(6):
        for il in sorted(hx.pool_of):
            T = int(rng.integers(1, 9))
            ids = np.stack([rng.choice(n_expert, 2, replace=False) for _ in range(T)]).astype(np.int32)
            if ids.size > dev.max_ids:
                continue
            dev.step(FakeCupy.asarray(ids), il)
            h, m = model.step(il, ids)
            hits, misses = hits + h, misses + m
            row = np.asarray(dev.slot_of(il))
            for e in np.unique(ids):
                s = int(row[e])
                assert s >= 0 and model.slot_of[(il, int(e))] == s
                for k, eb in enumerate(pool.ebytes):
                    assert np.array_equal(dev.bufs[k][s * eb:(s + 1) * eb], _expert_bytes(g, il, int(e), k, eb))
            assert dev.contents() == {k: v for k, v in model.slot_of.items()}
    st = dev.stats()
    assert (st["hits"], st["misses"]) == (hits, misses) and misses > 0 and hits > 0
    assert st["bytes_streamed"] == misses * sum(pool.ebytes)


def _fake_backend(be, log, plan_path):
    def moe_plan(ids, ws, bases=None):
        return {"path": plan_path, "pos": None}

    def moe_run(plan, h, ids, ws, act, bases=None, slot_of=None, y=None, rnd=None):
        log.append((bases, None if slot_of is None else np.asarray(slot_of).copy(), rnd))
        return np.zeros((ids.size, h.shape[1]), np.float32) if y is None else y
    be.moe_plan, be.moe_products = moe_plan, moe_run
    be.moe_combine = lambda y, pos, w: None


def test_decode_goes_through_the_device_cache_without_host_sync(tiny_moe, monkeypatch):
    """T <= 8 with a fused type: no cp.asnumpy (host sync) anywhere, the products read the device
    cache's buffers through the layer's table row, which maps the routed experts to their bytes."""
    g, be, hx = _host_experts(monkeypatch, tiny_moe, dev_slots=16)
    log = []
    _fake_backend(be, log, "pairs")
    monkeypatch.setattr(FakeCupy, "no_sync", True)
    pool = hx.pools[0]
    ids = np.array([[1, 4]], np.int32)
    for il in sorted(hx.pool_of):
        hx.moe_experts(be, np.zeros((1, 8), np.float32), il, ids, np.ones((1, 2), np.float32), "silu")
        bases, slot_of, _ = log[-1]
        assert bases is pool.dev.bufs
        for e in (1, 4):
            s = slot_of[e]
            for k, eb in enumerate(pool.ebytes):
                assert np.array_equal(bases[k][s * eb:(s + 1) * eb], _expert_bytes(g, il, e, k, eb))
    st = hx.stats()
    assert st["dev_calls"] == len(hx.pool_of) and st["host_calls"] == 0 and st["host_syncs"] == 0
    assert st["dev_misses"] == 2 * len(hx.pool_of)


def test_prefill_chunk_makes_the_layer_resident_without_reading_ids(tiny_moe, monkeypatch):
    """A chunk with >= FULL_LAYER token-slots an expert: one round of every expert, no host sync;
    smaller chunks read the ids (one sync) and make only the routed experts resident."""
    g, be, hx = _host_experts(monkeypatch, tiny_moe, n_slots=64, dev_launch=None)
    n_expert = hx.weights[0][0].shape[0]
    log = []
    _fake_backend(be, log, "gemm")
    pool = hx.pools[0]
    T = hx.full_layer * n_expert // 2
    rng = np.random.default_rng(0)
    ids = np.stack([rng.choice(n_expert, 2, replace=False) for _ in range(T)]).astype(np.int32)
    monkeypatch.setattr(FakeCupy, "no_sync", True)
    for il in sorted(hx.pool_of):
        hx.moe_experts(be, np.zeros((T, 8), np.float32), il, ids, np.ones((T, 2), np.float32), "silu")
        _, slot_of, rnd = log[-1]
        assert rnd.experts == tuple(range(n_expert))
        for e in range(n_expert):
            s = slot_of[e]
            for k, eb in enumerate(pool.ebytes):
                assert np.array_equal(pool.bufs[k][s * eb:(s + 1) * eb], _expert_bytes(g, il, e, k, eb))
    assert hx.stats()["full_layers"] == len(hx.pool_of)
    monkeypatch.setattr(FakeCupy, "no_sync", False)
    small = ids[:12]                                  # 24 token-slots: read the ids
    hx.moe_experts(be, np.zeros((12, 8), np.float32), 0, small, np.ones((12, 2), np.float32), "silu")
    assert set(log[-1][2].experts) <= set(np.unique(small).tolist())
    assert hx.stats()["host_syncs"] == 1


def test_budget_split_and_defaults():
    import inspect
    from lite.backend_config import BackendConfig
    from lite.backends import cuda_host_experts as hx_mod
    c = BackendConfig()
    assert c.expert_prefetch and c.expert_device_cache and c.expert_prefill_share == 0.5 and c.expert_full_layer == 16
    defaults = {k: v.default for k, v in inspect.signature(hx_mod.HostExperts).parameters.items()}
    assert (defaults["prefetch"], defaults["device_cache"], defaults["prefill_share"], defaults["full_layer"]) == (
        c.expert_prefetch, c.expert_device_cache, c.expert_prefill_share, c.expert_full_layer)
    split = hx_mod.HostExperts._dev_split
    # 30B-A3B, 128 experts, a 50% cache of 48 layers: 3072 slots, half for decode
    assert split(3072, 128, "host", True, None, None) == 1536
    assert split(1536, 128, "host", True, None, None) == 768
    assert split(300, 128, "host", True, None, None) == 0        # two layers' staging first
    assert split(3072, 128, "mmap", True, None, None) == 0       # no pinned source
    assert split(3072, 128, "host", False, None, None) == 0      # --expert-cache off
    assert split(3072, 128, "host", True, 8, None) == 0          # tests' n_slots
    assert split(3072, 128, "host", True, 8, 20) == 20
    assert split(3072, 128, "host", True, None, None, device_cache=False) == 0
    assert split(3072, 128, "host", True, None, None, prefill_share=0.75) == 768


@needs_gpu
def test_gpu_step_kernel_matches_twin():
    """expert_cache_step and expert_cache_fetch on the GPU against step_ref and the host bytes, over random calls."""
    import cupy as cp
    import cupyx
    n_expert, layers, n_dev, ebytes = 128, [0, 1, 2], 40, [4096, 4096, 2064]
    src = {il: [cupyx.empty_pinned(n_expert * eb, np.uint8) for eb in ebytes] for il in layers}
    rng = np.random.default_rng(1)
    for il in layers:
        for a in src[il]:
            a[...] = rng.integers(0, 256, a.size, dtype=np.uint8)
    dev = xd.DeviceExpertCache(cp, n_dev, layers, n_expert, ebytes, lambda il, k: src[il][k].ctypes.data, 32)
    ref = {"table": np.full((3, n_expert), -1, np.int32), "key": np.full(n_dev, -1, np.int32),
           "stamp": np.full(n_dev, -1, np.int32), "clock": np.zeros(1, np.int32),
           "fetch": np.zeros(65, np.int32), "counters": np.zeros(3, np.uint64)}
    for step in range(40):
        il = layers[step % 3]
        T = int(rng.integers(1, 5))
        ids = np.stack([rng.choice(24 if step % 2 else n_expert, 8, replace=False) for _ in range(T)]).astype(np.int32)
        dev.step(cp.asarray(ids), il)
        kx.step_ref(ids, dev.row[il], n_expert, ref["table"], ref["key"], ref["stamp"], ref["clock"],
                    ref["fetch"], ref["counters"])
        for name in ("table", "key", "stamp", "clock", "counters"):
            assert np.array_equal(getattr(dev, name).get(), ref[name]), (step, name)
        n = int(ref["fetch"][0])
        assert np.array_equal(dev.fetch.get()[:1 + 2 * n], ref["fetch"][:1 + 2 * n])
        row = ref["table"][dev.row[il]]
        for e in np.unique(ids):
            s = int(row[e])
            for k, eb in enumerate(ebytes):
                assert np.array_equal(dev.bufs[k][s * eb:(s + 1) * eb].get(), src[il][k][e * eb:(e + 1) * eb])


# --- the cache kernels' CUDA C on the host (tests/cuda_c_emulator.py) ---

# The warp vote and the block count the cache kernels use, on the host (the emulator has the rest).
CACHE_SHIMS = r"""
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline unsigned __ballot_sync(unsigned, bool p) {
    int lane = threadIdx.x & 31;
    tl_warp->buf[lane] = p ? 1ull : 0ull;
    tl_warp->bar->arrive_and_wait();
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= (unsigned)tl_warp->buf[i] << i;
    tl_warp->bar->arrive_and_wait();
    return r;
}
static std::atomic<int> emu_stc{0};
inline int __syncthreads_count(int p) {
    __syncthreads();
    if (p) emu_stc.fetch_add(1);
    __syncthreads();
    int r = emu_stc.load();
    __syncthreads();
    if (threadIdx.x == 0) emu_stc.store(0);
    __syncthreads();
    return r;
}
"""
# The emulator launches 2D grids: the wrapper takes expert_cache_fetch's blockIdx.z (gate, up, down) out of y.
FETCH_WRAP = r"""
extern "C" __global__ void emu_fetch(const int* fetch, const unsigned char* src0, const unsigned char* src1,
        const unsigned char* src2, long long eb0, long long eb1, long long eb2,
        unsigned char* dst0, unsigned char* dst1, unsigned char* dst2) {
    blockIdx.z = blockIdx.y % 3; blockIdx.y /= 3;
    expert_cache_fetch(fetch, src0, src1, src2, eb0, eb1, eb2, dst0, dst1, dst2);
}
"""


@pytest.fixture(scope="module")
def cache_kernels():
    return emu.compile_kernels(CACHE_SHIMS + kx.C_XC + FETCH_WRAP)


@pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")
def test_step_and_fetch_match_the_twin(cache_kernels):
    n_expert, rows, n_dev, max_ids = 40, 3, 12, 8
    ebytes = [64, 64, 40]                 # 40: not a multiple of 16, the byte loop
    rng = np.random.default_rng(5)
    src = [[rng.integers(0, 256, n_expert * eb, dtype=np.uint8) for eb in ebytes] for _ in range(rows)]
    dst = [np.zeros(n_dev * eb, np.uint8) for eb in ebytes]
    got = {"table": np.full((rows, n_expert), -1, np.int32), "key": np.full(n_dev, -1, np.int32),
           "stamp": np.full(n_dev, -1, np.int32), "clock": np.zeros(1, np.int32),
           "fetch": np.zeros(1 + 2 * max_ids, np.int32), "counters": np.zeros(3, np.uint64)}
    want = {k: v.copy() for k, v in got.items()}
    for step in range(30):
        row = step % rows
        T = int(rng.integers(1, 5))
        ids = np.stack([rng.choice(10 if step % 3 else n_expert, 2, replace=False)
                        for _ in range(T)]).astype(np.int32)
        cache_kernels.launch("expert_cache_step", (1,), (kx.STEP_THREADS,), ids, np.int32(ids.size),
                             np.int32(row), np.int32(n_expert),
                             got["table"], got["key"], got["stamp"], got["clock"], np.int32(n_dev), got["fetch"],
                             got["counters"])
        kx.step_ref(ids, row, n_expert, want["table"], want["key"], want["stamp"], want["clock"], want["fetch"],
                    want["counters"])
        for k in ("table", "key", "stamp", "clock", "counters"):
            assert np.array_equal(got[k], want[k]), (step, k)
        n = int(want["fetch"][0])
        assert np.array_equal(got["fetch"][:1 + 2 * n], want["fetch"][:1 + 2 * n]), step
        cache_kernels.launch("emu_fetch", (2, 3 * ids.size), (32,), got["fetch"], *src[row],
                             *[np.int64(eb) for eb in ebytes], *dst)
        for e in np.unique(ids):
            s = int(want["table"][row, e])
            for k, eb in enumerate(ebytes):
                assert np.array_equal(dst[k][s * eb:(s + 1) * eb], src[row][k][e * eb:(e + 1) * eb]), (step, e, k)
    assert want["counters"][1] > n_dev                  # evictions happened
