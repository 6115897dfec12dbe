"""--experts / --expert-cache: the flags through the engine (CPU), and on the GPU outputs that are
byte-identical whether the experts live on the device or stream from host RAM or the file's pages
through a cache of any size (all experts, some, one); the copy machinery on the CPU. The cache
managed on the device: tests/test_expert_device_cache.py."""
import types

import numpy as np
import pytest

from fake_cupy import HostCupy

from lite.backends import cuda_unavailable_reason
from lite.backends.cpu import CPUBackend
from lite.cli.main import main as cli_main
from lite.engine.engine import Engine
from lite.errors import LiteError
from lite.files.gguf_file import GGUFFile
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
