"""Experts: the cache's logic and the grouped MoE path's index logic on the CPU (NumPy twins of the
kernels against the CPU backend); the grouped GPU kernels against the twins and the CPU backend on
the GPU machine (skipped elsewhere)."""
import numpy as np
import pytest

from lite.backends import experts as ex
from lite.backends import cuda_unavailable_reason
from lite.backends.cpu import CPUBackend
from lite.files.gguf_file import GGUFFile
from lite.kernels import moe_layer as mk
from lite.kernels import moe_products as mp
from lite.files.synth import synth

GPU_WHY = cuda_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_WHY is not None, reason=f"needs a GPU: {GPU_WHY}")


# ---------------------------------------------------------------- residency
def test_parse_cache():
    assert ex.parse_cache("auto") == "auto"
    assert ex.parse_cache("off") == 0
    assert ex.parse_cache("12") == 12 * ex.GiB
    assert ex.parse_cache("0.5") == ex.GiB // 2
    assert ex.parse_cache("25%") == ex.Share(0.25)
    assert ex.parse_cache("100%") == ex.Share(1.0)
    for bad in ("12GB", "0%", "150%", "%", "-5%"):
        with pytest.raises(ValueError, match="expert-cache"):
            ex.parse_cache(bad)


def test_resolve_residency():
    G = ex.GiB
    assert ex.resolve("auto", "auto", 10 * G, 80 * G, 100 * G, G // 8) == ex.Residency("gpu", 0)
    r = ex.resolve("auto", "auto", 100 * G, 40 * G, 200 * G, G // 8)
    assert r.mode == "host" and r.cache_bytes == int(0.9 * 40 * G)
    assert ex.resolve("auto", "4", 100 * G, 40 * G, 50 * G, G // 8) == ex.Residency("mmap", 4 * G)
    assert ex.resolve("host", "off", G, 80 * G, 100 * G, G // 8) == ex.Residency("host", G // 4)
    # two layers of staging at least, as far as the VRAM goes
    assert ex.resolve("host", "0.5", 48 * G, 80 * G, 100 * G, G // 8, G) == ex.Residency("host", 2 * G)
    assert ex.resolve("host", "off", 48 * G, G, 100 * G, G // 8, G) == ex.Residency("host", int(0.9 * G))
    # a share of the experts (--expert-cache 25%), still at least two layers
    assert ex.resolve("host", "25%", 48 * G, 80 * G, 100 * G, G // 8, G) == ex.Residency("host", 12 * G)
    assert ex.resolve("host", "2%", 48 * G, 80 * G, 100 * G, G // 8, G) == ex.Residency("host", 2 * G)
    with pytest.raises(ValueError, match="--experts"):
        ex.resolve("vram", "auto", G, G, G, 1)


# ---------------------------------------------------------------- the cache
class Log:
    """Injected copy/wait that record what the cache asked for."""

    def __init__(self):
        self.copies, self.waits = [], []

    def copy(self, layer, expert, slot, after):
        self.copies.append((layer, expert, slot, after))
        return ("copy", layer, expert)

    def wait(self, h):
        self.waits.append(h)


def make_cache(n_slots, retain=True):
    log = Log()
    return ex.ExpertCache(n_slots, log.copy, log.wait, lambda layer: 100, retain=retain), log


def test_lru_hits_misses_and_counters():
    c, log = make_cache(3)
    r = c.acquire(0, [5, 1])
    assert r.experts == (1, 5) and c.stats.misses == 2 and c.stats.bytes_streamed == 200
    c.release(r, done="k0")
    r = c.acquire(0, [1, 7])                        # 1 hits; 7 takes the last free slot
    assert c.stats.hits == 1 and c.stats.misses == 3 and c.stats.evictions == 0
    c.release(r, done="k1")
    r = c.acquire(1, [2])                           # evicts the least recently used: (0, 5)
    assert c.stats.evictions == 1 and not c.resident(0, 5) and c.resident(0, 1)
    assert log.copies[-1][3] == "k0"                # the refill waits for the compute that read it
    assert [w[2] for w in log.waits] == [5, 1, 7, 2]
    assert c.stats.rounds == 3 and c.stats.hit_rate() == 0.2
    assert set(c.stats.as_dict()) >= {"hits", "misses", "bytes_streamed", "wait_s", "hit_rate"}


def test_plan_rounds_resident_first_and_one_slot():
    c, _ = make_cache(2)
    c.release(c.acquire(3, [4]))
    assert c.plan(3, [7, 4, 4, 1, 9]) == [[4, 1], [7, 9]]
    one, log = make_cache(1)
    seen = []
    ex.run_layer(one, 0, np.array([[2, 0], [2, 1]]), lambda rnd: seen.append(rnd.experts))
    assert seen == [(0,), (1,), (2,)]
    assert one.stats.misses == 3 and one.contents() == {(0, 2): 0}
    assert ex.Round(0, (1, 3), (0, 2)).slot_of(4) == [-1, 0, -1, 2]


def test_eviction_by_next_turn_keeps_layers_through_cyclic_sweeps():
    """Prefill-like sweeps (every layer needs all its experts) with half the experts cached: LRU
    evicts each expert just before its next use; by next turn, half the uses hit."""
    def sweep_hits(layers):                   # 8 layers of 8 experts, 32 slots
        c = ex.ExpertCache(32, lambda *a: None, lambda h: None, lambda layer: 1, layers=layers)
        hits = []
        for _ in range(4):
            before = c.stats.hits
            for il in range(8):
                ex.run_layer(c, il, [[0, 1, 2, 3], [4, 5, 6, 7]], lambda rnd: None)
            hits.append(c.stats.hits - before)
        return hits
    assert sweep_hits(None) == [0, 0, 0, 0]
    assert sweep_hits(range(8)) == [0, 32, 32, 32]


def test_cache_off_forgets_after_each_round():
    c, _ = make_cache(4, retain=False)
    for _ in range(2):
        ex.run_layer(c, 0, [[1, 2]], lambda rnd: None)
    assert c.stats.hits == 0 and c.stats.misses == 4 and c.contents() == {}


def test_prefetch_counts_as_hits_and_spares_the_current_layer():
    c, log = make_cache(3)
    c.release(c.acquire(0, [1, 2]))
    assert c.prefetch(1, [4, 5, 6], keep_layer=0) == 1   # one free slot; layer 0's stay
    assert c.resident(0, 1) and c.resident(0, 2)
    c.release(c.acquire(1, [4]))
    assert c.stats.hits == 1 and c.stats.prefetched == 1
    assert c.prefetch(2, [0, 1], keep_layer=1) == 2        # now layer 0's are fair game
    assert not c.resident(0, 1) and not c.resident(0, 2) and c.resident(1, 4)


# ---------------------------------------------------------------- byte-identical through any cache
def _fake_moe(seed=0, n_expert=6, n_embd=16, ff=8, T=7, k=2):
    rng = np.random.default_rng(seed)
    W = {n: rng.standard_normal((n_expert,) + s).astype(np.float32)
         for n, s in (("gate", (ff, n_embd)), ("up", (ff, n_embd)), ("down", (n_embd, ff)))}
    h = rng.standard_normal((T, n_embd)).astype(np.float32)
    ids, w = mk.route_ref(rng.standard_normal((T, n_expert)) * 2, k, True)
    return W, h, ids, w


def _through_cache(W, h, ids, wts, n_slots, retain=True):
    """A fake backend whose device is NumPy: slots are rows of one byte pool per tensor."""
    n_expert = W["gate"].shape[0]
    per = {n: W[n][0].nbytes for n in W}
    pools = {n: np.zeros((n_slots, per[n]), np.uint8) for n in W}

    def copy(layer, e, slot, after):
        for n in W:
            pools[n][slot] = W[n][e].reshape(-1).view(np.uint8)
        return slot

    cache = ex.ExpertCache(n_slots, copy, lambda h_: None, lambda layer: sum(per.values()), retain=retain)
    S = ids.size
    y = np.full((S, h.shape[1]), np.nan, np.float32)          # rows by token-slot

    def compute(rnd):
        slot_of = rnd.slot_of(n_expert)
        for s, e in enumerate(ids.reshape(-1)):
            if slot_of[e] < 0:
                continue
            m = {n: pools[n][slot_of[e]].view(np.float32).reshape(W[n].shape[1:]) for n in W}
            x = h[s // ids.shape[1]]
            g, u = m["gate"] @ x, m["up"] @ x
            y[s] = m["down"] @ (g / (1 + np.exp(-g)) * u)

    ex.run_layer(cache, 0, ids, compute)
    assert not np.isnan(y).any()
    return mk.combine_ref(y, np.arange(S), wts), cache.stats


def test_results_identical_whatever_the_cache_size():
    W, h, ids, wts = _fake_moe()
    ref, _ = _through_cache(W, h, ids, wts, 6)
    for n_slots, retain in ((1, True), (2, True), (3, True), (5, False), (64, True)):
        out, stats = _through_cache(W, h, ids, wts, n_slots, retain)
        assert out.tobytes() == ref.tobytes(), n_slots
        assert stats.misses >= len(np.unique(ids))
    # and it is the MoE the CPU backend computes (up to float summation order)
    want = np.zeros_like(h)
    for t in range(h.shape[0]):
        for j, e in enumerate(ids[t]):
            g, u = W["gate"][e] @ h[t], W["up"][e] @ h[t]
            want[t] += wts[t, j] * (W["down"][e] @ (g / (1 + np.exp(-g)) * u))
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)


def test_stager_double_buffers():
    bufs = [np.zeros(4, np.uint8) for _ in range(2)]
    dst = np.zeros(10, np.uint8)
    events, waited = [], []

    def fill(i, src, off, n):
        bufs[i][:n] = src[off:off + n]

    def upload(i, d, off, n):
        d[off:off + n] = bufs[i][:n]
        events.append(i)
        return len(events)

    st = ex.Stager(4, fill, upload, waited.append)
    src = np.arange(10, dtype=np.uint8)
    assert st.copy(src, dst, 10) == 3
    assert np.array_equal(dst, src) and st.uploads == 3
    assert events == [0, 1, 0] and waited == [1]    # buffer 0 reused only after its first upload


# ---------------------------------------------------------------- the grouped path's index logic
@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "qwen3moe-Q4_K.gguf"
    synth("qwen3moe", "tiny", "Q4_K", str(path), seed=3)
    return str(path)


def _cpu(path, layer=0):
    g = GGUFFile(path)
    names = [n for n in g.tensors if n.startswith(f"blk.{layer}.")]
    return CPUBackend(g, names)


def test_route_twin_matches_cpu_backend():
    rng = np.random.default_rng(1)
    cpu = CPUBackend.__new__(CPUBackend)
    for n_expert, k, T in ((8, 2, 5), (128, 8, 33), (60, 4, 3)):
        cpu.w = {"r": rng.standard_normal((n_expert, 32)).astype(np.float32)}
        h = rng.standard_normal((T, 32)).astype(np.float32)
        for norm in (True, False):
            ids, w = cpu.moe_route(h, "r", k, norm)
            ids2, w2 = mk.route_ref(h @ cpu.w["r"].T, k, norm)
            assert np.array_equal(ids, ids2) and np.array_equal(w, w2)


def test_route_twin_ties_take_the_lower_index():
    ids, w = mk.route_ref(np.array([[1.0, 3.0, 3.0, 0.0, 3.0]]), 2, True)
    assert ids.tolist() == [[1, 2]] and np.allclose(w, 0.5)


@pytest.mark.parametrize("bm", [1, 8, 16, 64])
def test_align_twin_invariants(bm):
    rng = np.random.default_rng(bm)
    n_expert, T, k = 16, 37, 4
    ids = np.stack([rng.choice(n_expert, k, replace=False) for _ in range(T)])
    a = mk.align_ref(ids, n_expert, bm)
    flat = ids.reshape(-1)
    pos = a["pos"]
    assert len(set(pos.tolist())) == flat.size                      # a permutation into padded rows
    assert np.array_equal(a["blk_rows"][pos], np.arange(flat.size) // k)
    assert np.array_equal(a["blk_expert"][pos // bm], flat)          # every block is one expert
    assert (a["blk_rows"] >= 0).sum() == flat.size
    assert a["n_blocks"] <= mk.max_blocks(flat.size, n_expert, bm) == a["blk_expert"].size
    assert (a["blk_expert"][a["n_blocks"]:] == -1).all()
    for e in range(n_expert):                                       # stable: slot order kept
        assert np.all(np.diff(pos[flat == e]) > 0)
    used = np.unique(flat)
    assert np.array_equal(a["used_list"][:a["n_used"]], used) and a["n_used"] == used.size
    assert np.array_equal(a["rank"][used], np.arange(used.size))


@pytest.mark.parametrize("bm", [1, 8, 32])
def test_grouped_twin_matches_cpu_moe_experts(tiny_moe, bm):
    """route -> align -> per-block products -> combine, in NumPy, against CPUBackend.moe_experts."""
    cpu = _cpu(tiny_moe)
    rng = np.random.default_rng(2)
    h = rng.standard_normal((23, 256)).astype(np.float32)
    ids, w = cpu.moe_route(h, "blk.0.ffn_gate_inp.weight", 2, True)
    a = mk.align_ref(ids, 8, bm)
    W = {n: np.stack([cpu._expert(f"blk.0.ffn_{n}_exps.weight", e) for e in range(8)])
         for n in ("gate", "up", "down")}
    y = np.full((a["blk_rows"].size, 256), np.nan, np.float32)
    for b in range(a["n_blocks"]):                                  # what a kernel block computes
        e, rows = a["blk_expert"][b], a["blk_rows"][b * bm:(b + 1) * bm]
        x = h[rows[rows >= 0]]
        g, u = x @ W["gate"][e].T, x @ W["up"][e].T
        y[b * bm:b * bm + len(x)] = cpu.act_mul(g, u, "silu") @ W["down"][e].T
    out = mk.combine_ref(y, a["pos"], w)
    np.testing.assert_allclose(out, cpu.moe_experts(h, 0, ids, w, "silu"), rtol=1e-4, atol=1e-5)


def test_kernel_sources_build_from_the_shared_pieces():
    for q in ("Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q5_K"):
        src = mk.gather_dequant_source(q)
        assert src is not None and src.count("sel[blockIdx.y]") == 2, q   # f16 and f32 kernels
    assert mk.gather_dequant_source("IQ3_XXS") is None          # its own kernel (dequant_iq.py)
    assert "moe_sorted_product" in mp.sorted_source() and "struct TQ4_K" in mp.sorted_source()


# ---------------------------------------------------------------- on the GPU
def _gpu(path):
    from lite.backends.cuda import CUDABackend
    g = GGUFFile(path)
    b = CUDABackend(g, [n for n in g.tensors if n.startswith("blk.0.")])
    return b


@needs_gpu
def test_gpu_route_and_align_match_twins():
    import cupy as cp
    rng = np.random.default_rng(4)
    for n_expert, k, T in ((8, 2, 5), (128, 8, 300), (512, 10, 70)):
        lg = rng.standard_normal((T, n_expert)).astype(np.float32)
        ids, w = cp.empty((T, k), np.int32), cp.empty((T, k), np.float32)
        mk.topk(cp.asarray(lg), k, True, ids, w)
        rid, rw = mk.route_ref(lg, k, True)
        assert np.array_equal(ids.get(), rid)
        np.testing.assert_allclose(w.get(), rw, rtol=1e-5)
        for bm in (8, 64):
            want = mk.align_ref(rid, n_expert, bm)
            nbm = want["blk_expert"].size
            got = {"blk_expert": cp.empty(nbm, np.int32), "blk_rows": cp.empty(nbm * bm, np.int32),
                   "pos": cp.empty(T * k, np.int32), "used_list": cp.empty(n_expert, np.int32),
                   "rank": cp.empty(n_expert, np.int32), "meta": cp.empty(2, np.int32)}
            mk.align(cp.asarray(rid), n_expert, bm, got)
            for key in ("blk_expert", "blk_rows", "pos", "used_list", "rank"):
                assert np.array_equal(got[key].get(), want[key]), key
            assert got["meta"].get().tolist() == [want["n_blocks"], want["n_used"]]


def check_layer_experts_match_cpu(path, T):
    """Layer 0's experts of a tiny qwen3moe file on the GPU against the CPU backend, for T tokens
    routed by the CPU; returns (gpu backend, h, the CPU's ids) for further checks."""
    cpu, gpu = _cpu(path), _gpu(path)
    rng = np.random.default_rng(T)
    h = rng.standard_normal((T, 256)).astype(np.float32)
    ids, w = cpu.moe_route(h, "blk.0.ffn_gate_inp.weight", 2, True)
    want = cpu.moe_experts(h, 0, ids, w, "silu")
    with gpu.activate():
        got = gpu.moe_experts(gpu.cp.asarray(h), 0, ids, w, "silu").get()
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    return gpu, h, ids


@needs_gpu
@pytest.mark.parametrize("T", [1, 5, 40, 100])   # pairs, pairs, sorted blocks, dequant + batched GEMM
def test_gpu_grouped_experts_match_cpu(tiny_moe, T):
    gpu, h, ids = check_layer_experts_match_cpu(tiny_moe, T)
    with gpu.activate():
        gids, gw = gpu.moe_route(gpu.cp.asarray(h), "blk.0.ffn_gate_inp.weight", 2, True)
    assert (gids.get() == ids).mean() > 0.95


@needs_gpu
def test_gpu_gemm_path_with_rounds_matches_one_pass(tiny_moe):
    """Two rounds of a cache (half the experts each, from slot buffers) fill the same rows."""
    import cupy as cp
    gpu = _gpu(tiny_moe)
    rng = np.random.default_rng(7)
    with gpu.activate():
        h = cp.asarray(rng.standard_normal((100, 256)).astype(np.float32))
        ids, w = gpu.moe_route(h, "blk.0.ffn_gate_inp.weight", 2, True)
        ws = [gpu.w[f"blk.0.ffn_{n}_exps.weight"] for n in ("gate", "up", "down")]
        plan = gpu.moe_plan(ids, ws)
        assert plan["path"] == "gemm"
        one = gpu.moe_products(plan, h, ids, ws, "silu")
        y = cp.full_like(one, np.nan)
        for experts in ((0, 2, 4, 6), (1, 3, 5, 7)):
            rnd = ex.Round(0, experts, tuple(range(4)))
            bases = [cp.concatenate([w_.data[e * (w_.data.size // 8):(e + 1) * (w_.data.size // 8)]
                                     for e in experts]) for w_ in ws]
            slot_of = cp.asarray(np.array(rnd.slot_of(8), np.int32))
            gpu.moe_products(plan, h, ids, ws, "silu", bases=bases, slot_of=slot_of, y=y)
        pos = plan["pos"]
        assert cp.array_equal(y[pos], one[pos])
