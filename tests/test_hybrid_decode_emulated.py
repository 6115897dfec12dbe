"""qwen3next's decode as the GPU runs it with BackendConfig.hybrid_graphs (issue 42), without a GPU.

- The fused kernels of kernels/cuda/delta_rule.cu compiled with g++ (tests/cuda_c_emulator.py):
  delta_decode_fused (a recurrent layer's token in one launch) against the unfused kernels and the
  CPU's functions; sigmoid_gate_add (the shared expert's gate and add) against the CPU.
- Stage._decode_graphed on a hybrid: the fixture model on the CUDA backend's recurrent and
  attention ops (emulated, tests/test_delta_rule_emulated.py's EmulatedGPUOps) with a host stand-in
  for a captured graph (the capture runs the step once, each replay runs it again with no host
  bookkeeping): graphed steps give the eager steps' logits and states byte for byte, the warm-up
  and capture leave the states as they were, and prefix reuse after graphed decode (where the
  states stand, and from a checkpoint) matches eager decode.
- The launches of one decode step before and after (emulated CUDA C launches by name, and the ops
  the stand-in serves from the CPU backend, each one launch or more on a GPU).
The same on the GPU machine: tests/test_qwen3next_gpu.py (hybrid_graphs).
"""
import collections
import contextlib
import types

import numpy as np
import pytest

import cuda_c_emulator
from lite.backend_config import BackendConfig
from lite.backends.cpu import CPUBackend
from lite.backends.cpu_recurrent import causal_conv_silu, delta_rule_recurrent
from lite.backends.cuda_moe import CUDAExperts
from lite.engine.engine import Engine
from lite.engine.stage import decode_graphs
from make_qwen3next_fixture import GGUF_PATH, REF_PATH
from test_delta_rule_emulated import EmulatedGPUOps, dr, emulated_modules  # noqa: F401 (fixtures)

needs_gxx = pytest.mark.skipif(not cuda_c_emulator.available(), reason="needs g++ (C++20) to emulate CUDA C")
GRAPHED = BackendConfig(hybrid_graphs=True)


# --- the fused kernels -----------------------------------------------------------------------------
def layer_inputs(T, Hk, Hv, dk, dv, K, seed):
    rng = np.random.default_rng(seed)
    C = 2 * Hk * dk + Hv * dv
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)   # noqa: E731
    return dict(qkv=f(T, C), ba=f(T, 2 * Hv) * 2, w=f(C, K) * 0.5, window=f(K - 1, C),
                A=-np.exp(f(Hv)), dt=f(Hv), S=f(Hv, dk, dv))


def unfused(fns, qkv, ba, w, window, A, dt, S, Hk, eps, scale):
    """The model's unfused decode path (models/qwen3next.py) over fns: gates, conv_silu, l2_norm, decode."""
    gates, conv_silu, l2_norm, decode = fns
    Hv, dk, dv = S.shape
    r = Hv // Hk
    b3 = ba.reshape(1, Hk, 2 * r)
    g, beta = gates(b3[:, :, :r].reshape(1, Hv), b3[:, :, r:].reshape(1, Hv), A, dt)
    c = conv_silu(qkv, w, window)
    q = l2_norm(c[:, :Hk * dk].reshape(1, Hk, dk), eps)
    k = l2_norm(c[:, Hk * dk:2 * Hk * dk].reshape(1, Hk, dk), eps)
    return decode(q, k, c[:, 2 * Hk * dk:].reshape(1, Hv, dv), g, beta, S, scale)


def kernel_fns(dr):
    return (lambda b, a, A, dt: dr.gates(b, a, A, dt, None), lambda x, w, s: dr.conv_silu(x, w, s, None),
            lambda x, eps: dr.l2_norm(x, eps, None), lambda *a: dr.decode(*a, None))


CPU_FNS = (lambda b, a, A, dt: CPUBackend.delta_gates(types.SimpleNamespace(w={"A": A, "dt": dt}), b, a, "A", "dt"),
           causal_conv_silu, lambda x, eps: CPUBackend.l2_norm(None, x, eps), delta_rule_recurrent)


@needs_gxx
@pytest.mark.parametrize("Hk,Hv,dk,dv,K", [
    (2, 4, 16, 16, 4),        # the fixture's shapes: two value heads a key head
    (2, 6, 18, 48, 4),        # three a key head, dk not a multiple of the warps, two column tiles
    (3, 3, 8, 40, 2),         # one value head a key head, a window of one row
])
def test_fused_decode_equals_the_unfused_kernels_and_the_cpu(dr, Hk, Hv, dk, dv, K):  # noqa: F811
    """Six tokens in turn on carried states: the output, the window and S of the fused launch
    against the five unfused launches and the CPU; the counters are left zero for the next."""
    x = layer_inputs(6, Hk, Hv, dk, dv, K, seed=dv + K)
    states = {n: (x["window"].copy(), x["S"].copy()) for n in ("fused", "unfused", "cpu")}
    counters = np.zeros(Hk, np.int32)
    eps, scale = 1e-6, dk ** -0.5
    for t in range(6):
        qkv, ba = x["qkv"][t:t + 1], x["ba"][t:t + 1]
        got = dr.decode_fused(qkv, ba, x["w"], states["fused"][0], x["A"], x["dt"], states["fused"][1],
                              counters, eps, scale, None)
        want = unfused(kernel_fns(dr), qkv, ba, x["w"], states["unfused"][0], x["A"], x["dt"],
                       states["unfused"][1], Hk, eps, scale)
        ref = unfused(CPU_FNS, qkv, ba, x["w"], states["cpu"][0], x["A"], x["dt"], states["cpu"][1], Hk, eps, scale)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
        assert not counters.any()
    for i, name in enumerate(("window", "S")):
        np.testing.assert_allclose(states["fused"][i], states["unfused"][i], rtol=1e-6, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(states["fused"][i], states["cpu"][i], rtol=1e-4, atol=1e-4, err_msg=name)


@needs_gxx
def test_fused_decode_checks_its_shapes(dr):  # noqa: F811
    x = layer_inputs(1, 2, 4, 16, 16, 4, seed=1)
    with pytest.raises(ValueError, match="delta decode"):      # fewer counters than key heads
        dr.decode_fused(x["qkv"], x["ba"], x["w"], x["window"], x["A"], x["dt"], x["S"],
                        np.zeros(1, np.int32), 1e-6, 0.25, None)
    with pytest.raises(ValueError, match="delta decode"):      # two tokens
        dr.decode_fused(np.repeat(x["qkv"], 2, 0), x["ba"], x["w"], x["window"], x["A"], x["dt"],
                        x["S"], np.zeros(2, np.int32), 1e-6, 0.25, None)


@needs_gxx
def test_sigmoid_gate_add_matches_cpu(dr):  # noqa: F811
    """Three rows, a gate vector longer than a block's threads (the dot over several passes)."""
    rng = np.random.default_rng(6)
    base, x = (rng.standard_normal((3, 50)).astype(np.float32) for _ in range(2))
    h = rng.standard_normal((3, 300)).astype(np.float32)
    cpu = types.SimpleNamespace(w={"g": rng.standard_normal(300).astype(np.float32) * 0.1}, pad_rows=False)
    cpu.sigmoid_gate = lambda *a: CPUBackend.sigmoid_gate(cpu, *a)
    want = CPUBackend.add_sigmoid_gated(cpu, base, x, h, "g")
    np.testing.assert_allclose(dr.sigmoid_gate_add(base, x, h, cpu.w["g"], None), want, rtol=1e-6, atol=1e-6)


# --- graphed decode of a hybrid stage on the emulated ops --------------------------------------------
class GraphedOps(EmulatedGPUOps):
    """EmulatedGPUOps as a CUDA backend that captures graphs, the graph a host stand-in (HostGraph);
    the shared expert's gate as CUDAExperts does it (the kernel with hybrid_graphs)."""
    supports_graphs, graph_io = True, None
    add_sigmoid_gated = CUDAExperts.add_sigmoid_gated

    def __init__(self, cpu, mods, config):
        super().__init__(cpu, mods)
        self.config, self.in_graph, self.replays = config, False, 0

    def activate(self):
        return contextlib.nullcontext()

    def begin(self, pos0, n_tokens):          # a graph reads the position the host set before it
        if not self.in_graph:
            super().begin(pos0, n_tokens)

    def persistent_input(self, x):
        return np.array(x, copy=True)

    def set_input(self, buf, x):
        np.copyto(buf, x)

    def capture(self, fn):
        g = HostGraph(self, fn)
        return g, g.out

    def replay(self, graph):
        self.replays += 1
        graph.launch()

    def to_host(self, x):
        return np.array(x, copy=True)         # (the graph's output buffer is rewritten each step)


class HostGraph:
    """Captured: fn runs once for its output buffer. Each launch runs fn again into that buffer,
    reading the same persistent inputs; no pos_dev write (begin) inside, as in a graph."""

    def __init__(self, ops, fn):
        self.ops, self.fn = ops, fn
        self.out = self._run()

    def _run(self):
        self.ops.in_graph = True
        try:
            return self.fn()
        finally:
            self.ops.in_graph = False

    def launch(self):
        np.copyto(self.out, self._run())


def emulated_engine(mods, graphs, layer_split=None, config=GRAPHED):
    e = Engine(GGUF_PATH, device="cpu", max_context=128, kv="f16", prefill_chunk=16, layer_split=layer_split)
    for st in e.stages:
        st.ops = GraphedOps(st.ops, mods, config)
        st.use_graphs = graphs
    return e


def fixture_ids(n):
    return [int(i) for i in np.load(REF_PATH)["ids"][:n]]


def states_of(e):
    rec = [st.kv.recurrent for st in e.stages]
    return ({il: (r.conv[il].copy(), r.ssm[il].copy()) for r in rec for il in r.pos},
            {il: p for r in rec for il, p in r.pos.items()})


def decode_run(e, ids, n):
    rows = [e.prefill(ids)]
    for _ in range(n):
        rows.append(e.decode_step(int(np.argmax(rows[-1]))))
    return np.stack(rows)


def assert_same_states(a, b):
    assert a[1] == b[1]
    for il in a[0]:
        for x, y in zip(a[0][il], b[0][il]):
            np.testing.assert_array_equal(x, y)


@needs_gxx
@pytest.mark.parametrize("layer_split", [2])
def test_graphed_decode_gives_the_eager_logits_and_states(emulated_modules, layer_split):  # noqa: F811
    """Five greedy tokens after a 12-token prompt, two stages (a first and a last): graphed = eager byte for byte
    (logits, both states of every layer, their positions), one capture a stage, a replay a step."""
    ids = fixture_ids(12)
    runs = {}
    for graphs in (True, False):
        e = emulated_engine(emulated_modules, graphs, layer_split)
        runs[graphs] = decode_run(e, ids, 5), states_of(e)
        if graphs:
            assert all(st._graph is not None and st.ops.replays == 5 for st in e.stages)
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    assert_same_states(runs[True][1], runs[False][1])
    assert set(runs[True][1][1].values()) == {len(ids) + 5}
    cpu = Engine(GGUF_PATH, device="cpu", max_context=128, kv="f32", prefill_chunk=16)
    want = decode_run(cpu, ids, 5)            # the fused kernels against the CPU's ops
    assert np.abs(runs[True][0] - want).max() < 1e-3 * np.abs(want).max()


@needs_gxx
def test_warm_up_and_capture_leave_the_states_as_they_were(emulated_modules, monkeypatch):  # noqa: F811
    """The first graphed step with its replay skipped: the warm-up and the capture ran the step's
    kernels twice, yet every state is as before; only the positions moved on (host bookkeeping)."""
    ids = fixture_ids(8)
    e = emulated_engine(emulated_modules, True)
    e.prefill(ids)
    st = e.stages[0]
    before = states_of(e)
    monkeypatch.setattr(st.ops, "replay", lambda graph: None)
    st._decode_graphed(np.asarray([5], np.int32), len(ids))
    assert st._graph is not None
    after = states_of(e)
    assert set(after[1].values()) == {len(ids) + 1}
    assert_same_states((after[0], before[1]), before)


@needs_gxx
def test_prefix_reuse_after_graphed_decode(emulated_modules):  # noqa: F811
    """A reply of 5 graphed tokens, then a turn that extends the whole history (the states reused
    where they stand), then one that branches inside the reply (the prompt's checkpoint at 10
    restored): the same reuse, logits and checkpoints as eager decode."""
    ids = fixture_ids(20)
    runs = {}
    for graphs in (True, False):
        e = emulated_engine(emulated_modules, graphs)
        reply = [int(t) for t in decode_run(e, ids[:10], 5).argmax(-1)[:5]]
        second = e.prefill(ids[:10] + reply + ids[10:13])
        reuse2 = e.last_reuse
        third = e.prefill(ids[:10] + reply[:3] + ids[10:20])
        rec = e.stages[0].kv.recurrent
        runs[graphs] = (second, third), (reuse2, e.last_reuse), rec.checkpoints
    (got, reuse, ckpt), (want, reuse_e, ckpt_e) = runs[True], runs[False]
    assert reuse == reuse_e == (15, 10)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert sorted(ckpt) == sorted(ckpt_e)
    for p in ckpt:
        for il in ckpt[p]:
            for x, y in zip(ckpt[p][il], ckpt_e[p][il]):
                np.testing.assert_array_equal(x, y)


def test_which_stages_capture():
    """Recurrent layers or a shared expert: only with hybrid_graphs; other stages as before."""
    def ops(hybrid_graphs, safe=True):
        return types.SimpleNamespace(supports_graphs=True, config=BackendConfig(hybrid_graphs=hybrid_graphs),
                                     moe_graph_safe=lambda: safe, graph_safe=lambda: True)
    hybrid = types.SimpleNamespace(is_moe=True, n_ff_shexp=48, is_recurrent_layer=lambda il: il % 2 == 0)
    dense = types.SimpleNamespace(is_moe=False, n_ff_shexp=0, is_recurrent_layer=lambda il: False)
    shexp = types.SimpleNamespace(is_moe=True, n_ff_shexp=48, is_recurrent_layer=lambda il: False)
    assert not decode_graphs(ops(False), hybrid, range(4))
    assert decode_graphs(ops(True), hybrid, range(4))
    assert not decode_graphs(ops(True, safe=False), hybrid, range(4))
    assert not decode_graphs(ops(False), shexp, [1])
    assert decode_graphs(ops(False), dense, range(4))
    assert not decode_graphs(types.SimpleNamespace(supports_graphs=False), dense, range(4))


# --- launches of one decode step ---------------------------------------------------------------------
class CountingCPU:
    """The CPU backend behind EmulatedGPUOps, counting the ops it serves (products, experts, adds:
    one launch or more each on a GPU)."""

    def __init__(self, cpu):
        self._cpu, self.calls = cpu, collections.Counter()

    def __getattr__(self, name):
        a = getattr(self._cpu, name)
        if not callable(a) or name.startswith("_"):
            return a

        def counted(*args, **kw):
            self.calls[name] += name != "has"         # (a lookup, not an op)
            return a(*args, **kw)
        return counted


def step_launches(mods, config, monkeypatch):
    """(CUDA C launches by kernel name, CPU-served ops by name) of one eager decode step."""
    e = Engine(GGUF_PATH, device="cpu", max_context=64, kv="f16", prefill_chunk=16)
    counting = CountingCPU(e.stages[0].ops)
    e.stages[0].ops = GraphedOps(counting, mods, config)
    e.stages[0].use_graphs = False
    e.prefill(fixture_ids(10))
    kernels = collections.Counter()
    launch = cuda_c_emulator.Kernels.launch
    counting.calls.clear()

    def counted(self, name, *a):
        kernels[name] += 1
        return launch(self, name, *a)
    with monkeypatch.context() as m:
        m.setattr(cuda_c_emulator.Kernels, "launch", counted)
        e.decode_step(7)
    return kernels, counting.calls, e.cfg


@needs_gxx
def test_one_decode_step_launches_fewer_kernels(emulated_modules, monkeypatch):  # noqa: F811
    """With hybrid_graphs a recurrent layer's gates, conv, two L2 norms and delta rule are one
    launch, and each layer's shared-expert gate and add one kernel instead of CPU-served ops."""
    before, served_before, cfg = step_launches(emulated_modules, BackendConfig(), monkeypatch)
    after, served_after, _ = step_launches(emulated_modules, GRAPHED, monkeypatch)
    n_rec = sum(cfg.is_recurrent_layer(il) for il in range(cfg.n_layer))
    print(f"\none decode step of the fixture ({cfg.n_layer} layers, {n_rec} recurrent): CUDA C launches "
          f"{sum(before.values())} -> {sum(after.values())}, ops served by the CPU "
          f"{sum(served_before.values())} -> {sum(served_after.values())}\n  before {dict(before)}"
          f"\n  after  {dict(after)}\n  served before {dict(served_before)}\n  served after  {dict(served_after)}")
    for name, n in (("delta_gates", 1), ("conv_silu", 1), ("l2_norm", 2), ("delta_rule_decode", 1)):
        assert before[name] == n * n_rec and after[name] == 0, name
    assert before["delta_decode_fused"] == 0 and after["delta_decode_fused"] == n_rec
    assert after["sigmoid_gate_add"] == cfg.n_layer and served_after["sigmoid_gate"] == 0
    assert served_before["sigmoid_gate"] == cfg.n_layer
    assert sum(after.values()) + sum(served_after.values()) < sum(before.values()) + sum(served_before.values())
