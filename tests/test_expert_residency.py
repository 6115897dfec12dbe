"""--experts / --expert-cache: the flags through the engine (CPU), and on the GPU outputs that are
byte-identical whether the experts live on the device or stream from host RAM or the file's pages
through a cache of any size (all experts, some, one); the copy machinery on the CPU.

Also the decode-time expert cache managed on the device (lite/backends/cuda_expert_dev.py) and the
host-managed path's prefill without syncs: on the CPU through a fake CuPy (tests/fake_cupy.py's HostCupy) and
the kernels' NumPy twins, on the GPU the kernels against the twins (skipped elsewhere); the kernels'
CUDA C (kernels/expert_cache.py: expert_cache_step, expert_cache_fetch) also on the host through
tests/cuda_c_emulator.py against the twin (needs g++)."""
import types

import numpy as np
import pytest

import cuda_c_emulator as emu
from fake_cupy import HostCupy
from fake_cupy import HostCupy as FakeCupy

from lite.backends import cuda_expert_dev as xd
from lite.backends import cuda_unavailable_reason
from lite.backends.cpu import CPUBackend
from lite.cli.main import main as cli_main
from lite.engine.engine import Engine
from lite.errors import LiteError
from lite.files.gguf_file import GGUFFile
from lite.kernels import expert_cache as kx
from lite.engine.sampling import Sampler, SamplingParams
from lite.files.synth import synth

GPU_WHY = cuda_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_WHY is not None, reason=f"needs a GPU: {GPU_WHY}")
GREEDY = Sampler(SamplingParams.greedy())


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "qwen3moe-Q4_K.gguf"
    synth("qwen3moe", "tiny", "Q4_K", str(path), seed=3)
    return str(path)


@pytest.fixture(scope="module")
def tiny_moe_iq(tmp_path_factory):
    """IQ3_XXS experts: no fused grouped kernel, so the per-expert loop (T <= 8) and the
    one-launch-a-slot dequantize (GEMM path) serve the streamed experts."""
    path = tmp_path_factory.mktemp("moe") / "qwen3moe-IQ3_XXS.gguf"
    synth("qwen3moe", "tiny", "IQ3_XXS", str(path), seed=3)
    return str(path)


# --- the flags, through the engine on the CPU ---
def test_bad_flags_are_one_line_errors(tiny_moe, capsys):
    with pytest.raises(LiteError, match="--experts"):
        Engine(tiny_moe, device="cpu", experts="vram")
    with pytest.raises(LiteError, match="expert-cache"):
        Engine(tiny_moe, device="cpu", expert_cache="12GB")
    assert cli_main(["bench", tiny_moe, "--expert-cache", "lots"]) != 0
    assert "expert-cache" in capsys.readouterr().err


def test_a_share_of_the_experts_is_a_cache_size(tiny_moe, capsys):
    """--expert-cache 25% (a share of the model's expert bytes) passes the flag checks of the
    engine and the CLI; 0% and over 100% are one-line errors."""
    Engine(tiny_moe, device="cpu", max_context=32, experts="host", expert_cache="25%")
    assert cli_main(["bench", tiny_moe, "-p", "8", "-n", "2", "-r", "1", "--device", "cpu",
                     "--experts", "host", "--expert-cache", "50%"]) == 0
    capsys.readouterr()
    assert cli_main(["bench", tiny_moe, "--expert-cache", "150%"]) != 0
    assert "expert-cache" in capsys.readouterr().err


def test_cpu_engine_takes_the_flags_and_ignores_them(tiny_moe):
    """The CPU backend reads experts from the mapped file anyway: same logits whatever the flags."""
    ids = [5, 17, 99, 3, 42]
    a = Engine(tiny_moe, device="cpu", max_context=32).prefill(ids)
    b = Engine(tiny_moe, device="cpu", max_context=32, experts="host", expert_cache="off").prefill(ids)
    assert a.tobytes() == b.tobytes()


# ---------------------------------------------------------------- on the GPU
def _backends(path, mode, n_slots, dev_slots=None):
    """A device-resident reference and a backend whose layer-0 experts come through `mode`
    (dev_slots: a device-managed decode cache of that many slots beside the host-managed one)."""
    from lite.backends.cuda import CUDABackend
    g = GGUFFile(path)
    names = [n for n in g.tensors if n.startswith("blk.0.")]
    exps = [n for n in names if n.endswith("_exps.weight")]
    ref = CUDABackend(g, names)
    streamed = CUDABackend(g, [n for n in names if n not in exps])
    with streamed.activate():
        r = streamed.place_experts(g, exps, mode, "auto", n_slots=n_slots, dev_slots=dev_slots)
    assert r.mode == mode and streamed.host_experts is not None
    return g, ref, streamed


@needs_gpu
@pytest.mark.parametrize("mode,n_slots", [("host", 8), ("host", 3), ("host", 1), ("mmap", 2)])
@pytest.mark.parametrize("T", [1, 5, 40, 100])   # pairs, pairs, sorted blocks, batched GEMM
def test_gpu_streamed_experts_byte_identical(tiny_moe, mode, n_slots, T):
    _check_streamed(tiny_moe, mode, n_slots, T)


@needs_gpu
@pytest.mark.parametrize("n_slots", [8, 1])
@pytest.mark.parametrize("T", [3, 100])
def test_gpu_streamed_iq_experts_byte_identical(tiny_moe_iq, n_slots, T):
    _check_streamed(tiny_moe_iq, "host", n_slots, T)


@needs_gpu
@pytest.mark.parametrize("dev_slots", [16, 4, 2])
@pytest.mark.parametrize("T", [1, 2, 5, 40])     # device cache (when T*k <= dev_slots), else host
def test_gpu_device_cache_experts_byte_identical(tiny_moe, dev_slots, T):
    """Decode through the device-managed cache (expert_cache_step, expert_cache_fetch from pinned host RAM): the same
    bytes as resident experts, with hits, misses and evictions; larger T takes the host path."""
    g, ref, streamed = _backends(tiny_moe, "host", 3, dev_slots)
    cpu = CPUBackend(g, [n for n in g.tensors if n.startswith("blk.0.")])
    rng = np.random.default_rng(T)
    for rep in range(4):                                # new routes: misses and evictions
        h = rng.standard_normal((T, 256)).astype(np.float32)
        ids, w = cpu.moe_route(h, "blk.0.ffn_gate_inp.weight", 2, True)
        with ref.activate():
            want = ref.moe_experts(ref.cp.asarray(h), 0, ids, w, "silu").get()
        for _ in range(2):
            with streamed.activate():
                got = streamed.moe_experts(streamed.cp.asarray(h), 0, ids, w, "silu").get()
            assert got.tobytes() == want.tobytes(), (rep, _)
    st = streamed.expert_stats()
    if T * 2 <= dev_slots:
        assert st["dev_calls"] == 8 and st["host_calls"] == 0 and st["dev_steps"] == 8
        assert st["dev_misses"] > 0 and st["dev_hits"] > 0
    else:
        assert st["dev_calls"] == 0 and st["host_calls"] == 8


def _check_streamed(path, mode, n_slots, T):
    g, ref, streamed = _backends(path, mode, n_slots)
    cpu = CPUBackend(g, [n for n in g.tensors if n.startswith("blk.0.")])
    h = np.random.default_rng(T).standard_normal((T, 256)).astype(np.float32)
    ids, w = cpu.moe_route(h, "blk.0.ffn_gate_inp.weight", 2, True)
    with ref.activate():
        want = ref.moe_experts(ref.cp.asarray(h), 0, ids, w, "silu").get()
    for _ in range(2):                                  # the second time, hits where slots allow
        with streamed.activate():
            got = streamed.moe_experts(streamed.cp.asarray(h), 0, ids, w, "silu").get()
        assert got.tobytes() == want.tobytes()
    st = streamed.expert_stats()
    used = len(np.unique(ids))
    assert st["misses"] >= used and st["hits"] + st["misses"] == 2 * used
    assert st["bytes_streamed"] == st["misses"] * sum(streamed.host_experts.pools[0].ebytes)
    if n_slots >= used:
        assert st["hits"] == used                      # everything stayed resident
    if n_slots == 1:
        assert st["rounds"] == 2 * used                # one expert a round


@needs_gpu
@pytest.mark.parametrize("experts,cache,dev", [("host", "auto", None), ("host", "auto", 6), ("host", "auto", 0),
                                               ("host", "off", None), ("mmap", "0.001", None)])
def test_gpu_engine_experts_host_matches_gpu(tiny_moe, monkeypatch, experts, cache, dev):
    """dev: the device cache's slots (None: the default split, which the tiny model's 32 experts
    reach only with DEV_MIN_SLOTS lowered; 6: fewer than a decode step's 8 layer-experts, so it
    evicts every step; 0: none). With a device cache, decode steps are graph-captured."""
    from lite.backends import cuda_host_experts as hx_mod
    monkeypatch.setattr(hx_mod, "DEV_MIN_SLOTS", 2)
    if dev is not None:
        monkeypatch.setattr(hx_mod.HostExperts, "_dev_split",
                            staticmethod(lambda *a: dev))
    ids = [5, 17, 99, 3, 42, 7, 8, 9, 10, 11, 12]
    on_gpu = Engine(tiny_moe, device="cuda", max_context=64, experts="gpu")
    off = Engine(tiny_moe, device="cuda", max_context=64, experts=experts, expert_cache=cache)
    graphs = experts == "host" and cache == "auto" and dev != 0
    assert on_gpu.stages[0].use_graphs and off.stages[0].use_graphs == graphs   # decode graphs for MoE
    assert off.expert_stats()["mode"] == experts and on_gpu.expert_stats() is None
    assert on_gpu.prefill(ids).tobytes() == off.prefill(ids).tobytes()
    a = list(on_gpu.generate(ids, 6, GREEDY, stop_at_eog=False))
    b = list(off.generate(ids, 6, GREEDY, stop_at_eog=False))
    assert a == b
    st = off.expert_stats()
    assert st["misses"] > 0
    if graphs:                       # decode steps replayed: the kernels counted more steps than calls
        assert st["dev_steps"] > st["dev_calls"] > 0 and st["dev_misses"] > 0


# ---------------------------------------------------------------- the copy machinery, on the CPU
@pytest.mark.parametrize("mode,n_slots", [("host", 64), ("host", 5), ("host", 1), ("mmap", 3)])
def test_copies_fill_the_right_slots(tiny_moe, monkeypatch, mode, n_slots):
    import sys
    from lite.backends import cuda_host_experts as hx_mod
    from lite.backends.experts import run_layer
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(empty_pinned=lambda n, dt: np.zeros(n, dt)))
    g = GGUFFile(tiny_moe)
    names = [n for n in g.tensors if n.endswith("_exps.weight")]
    be = types.SimpleNamespace(cp=HostCupy, stream=HostCupy.cuda.Stream(), moe_pairs_max_tokens=8)
    hx = hx_mod.HostExperts(be, g, names, mode, 0, n_slots=n_slots, prefetch=True)
    pool = hx.pools[0]
    rng = np.random.default_rng(n_slots)
    HostCupy.cuda.runtime.calls = 0
    for step in range(3):
        for il in range(4):
            ids = np.stack([rng.choice(8, 2, replace=False) for _ in range(int(rng.integers(1, 9)))])

            def compute(rnd):
                for e, s in zip(rnd.experts, rnd.slots):
                    for k, n in enumerate(hx_mod.KINDS):
                        eb = pool.ebytes[k]
                        want = g.tensors[f"blk.{il}.ffn_{n}_exps.weight"].raw.reshape(-1)[e * eb:(e + 1) * eb]
                        assert np.array_equal(pool.bufs[k][s * eb:(s + 1) * eb], want), (il, e, s, n)
            run_layer(pool.cache, il, ids, compute)
            hx._last[il] = np.unique(ids)
            hx._prefetch(il)
    st = hx.stats()
    assert st["misses"] > 0 and st["hits"] + st["misses"] >= 12
    if mode == "host" and n_slots == 64:     # runs of consecutive experts: fewer calls than copies
        assert HostCupy.cuda.runtime.calls < 3 * (st["misses"] + st["prefetched"])


# --- the device-managed decode cache (lite/backends/cuda_expert_dev.py) and the host path's prefill
# without syncs; tiny_moe, GPU_WHY and needs_gpu are the ones above ---
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
