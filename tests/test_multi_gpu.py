"""Layer stages across devices. Splitting the layers into stages changes no byte: on the CPU
backend, 1, 2, 3 and 4 stages at a fixed chunk size, for a dense and a MoE synthetic model (issue
5), in both pipeline modes. Across real GPUs (issue 7): one stage per GPU must give the same bytes
as one GPU; those tests skip unless the machine has at least two usable GPUs.

The GPU hand-off between stages (--handoff host|p2p, --handoff-stream), on the CPU: the CUDA
backend's hand-off mixin (lite/backends/cuda_handoff.py) driven by the real stage chain, against a
fake CuPy that logs stream operations and finds unordered memory accesses (tests/fake_cupy.py), and
how the resolved mode reaches the backends. What the fake cannot see (real copy speeds, real peer
access, CuPy's own behaviour) is for the two-GPU tests."""
import contextlib

import numpy as np
import pytest

from conftest import assert_stage_counts_agree
from fake_cupy import FakeCupy, _overlap, _span, installed
from lite.backend_config import BackendConfig
from lite.backends import cuda_handoff, cuda_unavailable_reason
from lite.backends.cuda_handoff import CUDAHandoff, HandoffBuffer
from lite.engine.engine import Engine
from lite.chain.pipeline import ChunkJob, StageChain
from lite.engine.sampling import Sampler, SamplingParams
from lite.files.synth import synth

WHY = cuda_unavailable_reason()


def _n_gpus():
    if WHY is not None:
        return 0
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


needs_two_gpus = pytest.mark.skipif(_n_gpus() < 2, reason=f"needs 2 or more GPUs "
                                    f"({WHY or f'{_n_gpus()} found'})")
GREEDY = Sampler(SamplingParams.greedy())


# --- on the CPU backend ---

@pytest.fixture(scope="module", params=[("llama", "Q4_K"), ("qwen3moe", "Q4_K")],
                ids=lambda p: p[0])
def cpu_model(request, tmp_path_factory):
    arch, quant = request.param
    path = tmp_path_factory.mktemp("split") / f"{arch}.gguf"
    synth(arch, "tiny", quant, str(path), seed=2)
    return str(path)


@pytest.mark.parametrize("mode", ["chain", "sync"])
def test_stage_counts_give_identical_bytes(cpu_model, mode):
    assert_stage_counts_agree(
        lambda stages: Engine(cpu_model, device="cpu", max_context=128, prefill_chunk=8,
                              layer_split=stages, pipeline=mode),
        list(range(7, 60)), 6)


# --- across real GPUs ---

# These tests compare bytes across stage boundaries: the decode norms split across the products (the
# default) run as plain norms at a boundary, ~1e-6 apart (test_cuda_backend's
# test_virtual_stages_identical_on_gpu checks that), so here they stay separate launches.
SEPARATE_NORMS = BackendConfig(fold_norm=False)


@pytest.fixture(scope="module", params=[("llama", "Q4_K"), ("qwen3moe", "Q4_K")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def model(request, tmp_path_factory):
    arch, quant = request.param
    path = tmp_path_factory.mktemp("synth") / f"{arch}-{quant}.gguf"
    synth(arch, "tiny", quant, str(path), seed=4)
    return str(path)


@needs_two_gpus
@pytest.mark.parametrize("pipeline", ["chain", "sync"])
def test_stages_on_separate_gpus_match_one_gpu(model, pipeline):
    n = min(_n_gpus(), 4)
    ids = list(range(3, 90))
    one = Engine(model, device="cuda", max_context=160, prefill_chunk=16, config=SEPARATE_NORMS)
    many = Engine(model, device="cuda", max_context=160, prefill_chunk=16, config=SEPARATE_NORMS,
                  devices=",".join(str(i) for i in range(n)), pipeline=pipeline)
    assert len({st.ops.device_key for st in many.stages}) == n
    assert np.array_equal(one.prefill(ids, all_logits=True), many.prefill(ids, all_logits=True))
    a = list(one.generate(ids + [5], 12, GREEDY, stop_at_eog=False))
    b = list(many.generate(ids + [5], 12, GREEDY, stop_at_eog=False))
    assert a == b


def _all_peers(n):
    import cupy
    can = cupy.cuda.runtime.deviceCanAccessPeer
    return all(can(a, b) for a in range(n) for b in range(n) if a != b)


@needs_two_gpus
@pytest.mark.parametrize("handoff_stream", [False, True], ids=["compute-stream", "copy-stream"])
@pytest.mark.parametrize("handoff", ["host", "p2p"])
def test_handoff_modes_match_one_gpu(model, handoff, handoff_stream):
    """--handoff host|p2p and --handoff-stream (lite/backends/cuda_handoff.py, written without a
    GPU: this is its first real run) give the bytes of one GPU, in prefill and graphed decode.
    Two stages a GPU, so that p2p also hands off between stages on one GPU."""
    n = min(_n_gpus(), 2)
    if handoff == "p2p" and not _all_peers(n):
        pytest.skip(f"GPUs 0..{n - 1} cannot all reach each other")
    ids = list(range(3, 90))
    one = Engine(model, device="cuda", max_context=160, prefill_chunk=16, config=SEPARATE_NORMS)
    many = Engine(model, device="cuda", max_context=160, prefill_chunk=16, config=SEPARATE_NORMS, layer_split=2 * n,
                  devices=",".join(str(i) for i in range(n)), handoff=handoff,
                  handoff_stream=handoff_stream)
    assert many.handoff == handoff
    assert [st.ops.device.id for st in many.stages] == [i // 2 for i in range(2 * n)]
    assert all((st.ops.copy_stream is not None) == handoff_stream for st in many.stages)
    for _ in range(2):           # the second prefill reuses every hand-off slot
        many.cached_ids = one.cached_ids = []
        assert np.array_equal(one.prefill(ids, all_logits=True), many.prefill(ids, all_logits=True))
    a = list(one.generate(ids + [5], 12, GREEDY, stop_at_eog=False))
    b = list(many.generate(ids + [5], 12, GREEDY, stop_at_eog=False))
    assert a == b

# --- the hand-off between stages, on a fake GPU (lite/backends/cuda_handoff.py, tests/fake_cupy.py) ---

N_EMBD = 4


class ToyGPUStage(CUDAHandoff):
    """A StageRunner on a fake GPU: y = x * 2 + k (the first stage embeds ids as id + k + column)."""

    def __init__(self, fake, device_id, k, mode="host", copy_stream=False, last=False):
        self.cp, self.k, self.last = fake, k, last
        self.device = fake.cuda.Device(device_id)
        with self.device:
            self.stream = fake.cuda.Stream(non_blocking=True)
        if mode != "host" or copy_stream:
            self.configure_handoff(mode, copy_stream)

    def activate(self):
        stack = contextlib.ExitStack()
        stack.enter_context(self.device)
        stack.enter_context(self.stream)
        return stack

    def run(self, job, x):
        cp = self.cp
        with self.activate():
            y = cp.empty((job.n_tokens, N_EMBD), np.float32)
            if isinstance(x, np.ndarray) and x.dtype.kind == "i":      # token ids from the host

                def fn():
                    y[...] = x[:, None] + self.k + np.arange(N_EMBD)
                cp.kernel(self.stream, [], [y], fn)
            else:
                assert x.gpu == self.device.id, "input not on this stage's GPU"

                def fn():
                    y[...] = x * 2 + self.k
                cp.kernel(self.stream, [x], [y], fn)
        return np.array(y) if self.last else y      # the last stage's to_host


def expected(ids, ks):
    y = ids[:, None] + ks[0] + np.arange(N_EMBD, dtype=np.float32)
    for k in ks[1:]:
        y = y * 2 + k
    return y.astype(np.float32)


def toy_chain(fake, devices, mode, copy_stream, depth=1):
    ks = [1.0 + i for i in range(len(devices))]
    stages = [ToyGPUStage(fake, d, k, mode, copy_stream, last=(i == len(devices) - 1))
              for i, (d, k) in enumerate(zip(devices, ks))]
    return StageChain(stages, handoff_depth=depth, device_times=False), ks


ASYNC = [("p2p", False), ("p2p", True), ("host", True)]


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("mode,copy_stream", ASYNC)
def test_chain_through_async_handoffs_is_right_and_ordered_on_the_device(monkeypatch, mode,
                                                                        copy_stream, depth):
    fake = FakeCupy()
    with installed(monkeypatch, fake):
        chain, ks = toy_chain(fake, [0, 1, 1], mode, copy_stream, depth)
        ids = np.arange(3, 26, dtype=np.int64)            # 23 tokens: chunks 4,4,4,4,4,3
        with chain:
            outs = chain.prefill(ids, 4)
            for t in range(3):                              # decode steps reuse slot 0
                job = ChunkJob(0, 30 + t, 30 + t, 31 + t, np.array([7 + t]), last=True,
                               decode=True)
                assert np.array_equal(chain.decode(job.input, job), expected(job.input, ks))
    assert np.array_equal(np.concatenate(outs), expected(ids, ks))
    assert fake.check_order() == []
    kinds = {op["what"] for op in fake.ops}
    if mode == "p2p":   # GPU 0 -> 1 peer to peer; 1 -> 1 on the device; never through the host
        assert "memcpyPeerAsync" in kinds and not kinds & {"memcpyAsync1", "memcpyAsync2", "get"}
        assert (1, 0) in fake.peer_enabled
    else:
        assert "memcpyAsync2" in kinds and "memcpyAsync1" in kinds and "memcpyPeerAsync" not in kinds
    assert not [c for c in fake.calls if c[0] == "synchronize"], "a host sync in the hand-off"
    for st in chain._stages[:-1]:   # what writes each producer's hand-off buffers
        spans = [_span(b.array) for b in st.slots if b is not None]
        writers = {op["stream"] for op in fake.ops if _overlap(op["writes"], spans)}
        assert writers == {st.runner.copy_stream if copy_stream else st.runner.stream}


@pytest.mark.parametrize("sabotage", ["read", "written", "compute"])
def test_the_order_check_catches_a_missing_wait(monkeypatch, sabotage):
    """Each event wait of the hand-off is needed: drop one and the fake finds the race (so the
    test above fails without the waits, though the fake's data stays right)."""
    fake = FakeCupy()
    real_wait = fake.cuda.Stream.wait_event
    skip = {"read": "read", "written": "written", "compute": None}[sabotage]

    def wait_event(stream, ev):
        for buf_state in list(_states):
            if skip and getattr(buf_state, skip) is ev:
                return
        if sabotage == "compute" and ev.op is not None and fake.ops[ev.op]["what"] == "kernel" \
                and stream.device == fake.ops[ev.op]["stream"].device:
            return          # the copy stream not waiting for the compute stream
        real_wait(stream, ev)
    _states = []
    real_state = cuda_handoff._SlotState

    def state(*a):
        s = real_state(*a)
        _states.append(s)
        return s
    monkeypatch.setattr(cuda_handoff, "_SlotState", state)
    monkeypatch.setattr(fake.cuda.Stream, "wait_event", wait_event)
    with installed(monkeypatch, fake):
        chain, _ = toy_chain(fake, [0, 1, 1], "p2p", sabotage == "compute")
        with chain:
            chain.prefill(np.arange(20, dtype=np.int64), 4)
    assert fake.check_order() != []


def test_event_is_recorded_on_the_producer_before_the_consumer_waits(monkeypatch):
    fake = FakeCupy()
    with installed(monkeypatch, fake):
        a, b = ToyGPUStage(fake, 0, 1.0, "p2p"), ToyGPUStage(fake, 1, 2.0, "p2p")
        job = ChunkJob(0, 0, 0, 3, np.arange(3))
        y = a.run(job, job.input)
        buf = a.alloc_handoff(y.shape, y.dtype)
        assert isinstance(buf, HandoffBuffer) and buf.array.gpu == 0     # on the producer
        with pytest.raises(RuntimeError, match="before the producer"):
            b.from_handoff(buf)
        a.to_handoff(y, buf)
        x = b.from_handoff(buf[:3])
    assert x.gpu == 1 and np.array_equal(x, y)
    rec = [i for i, c in enumerate(fake.calls) if c[0] == "record" and c[1] is a.stream]
    wait = [i for i, c in enumerate(fake.calls) if c[0] == "wait" and c[1] is b.stream]
    assert rec and wait and rec[-1] < wait[0]
    assert fake.calls[wait[0]][2] is buf.state.written
    peer = [op for op in fake.ops if op["what"] == "memcpyPeerAsync"]
    assert len(peer) == 1 and peer[0]["stream"] is b.stream          # issued by the consumer


def test_peer_access_enabled_once_per_pair_and_already_enabled_tolerated(monkeypatch, caplog):
    fake = FakeCupy()
    with installed(monkeypatch, fake):
        a = ToyGPUStage(fake, 0, 1.0, "p2p")
        consumers = [ToyGPUStage(fake, 1, 2.0, "p2p") for _ in range(2)]
        y = a.run(ChunkJob(0, 0, 0, 2, np.arange(2)), np.arange(2))
        buf = a.alloc_handoff(y.shape, y.dtype)
        for c in consumers:
            for _ in range(3):
                a.to_handoff(y, buf)
                c.from_handoff(buf)
    enables = [c for c in fake.calls if c[0] == "enable_peer"]
    assert [e[1] for e in enables] == [(1, 0), (1, 0)]      # once per backend; 704 the second time
    assert "peer access" not in caplog.text


def test_host_handoff_without_copy_stream_is_unchanged(monkeypatch):
    """The default path: a plain pinned buffer, a synchronized copy, no events."""
    fake = FakeCupy()
    with installed(monkeypatch, fake):
        a, b = ToyGPUStage(fake, 0, 1.0), ToyGPUStage(fake, 1, 2.0)
        y = a.run(ChunkJob(0, 0, 0, 2, np.arange(2)), np.arange(2))
        buf = a.alloc_handoff(y.shape, y.dtype)
        assert type(buf) is np.ndarray and fake.device_of(buf.ctypes.data, buf.nbytes) is None
        a.to_handoff(y, buf)
        x = b.from_handoff(buf)
    assert np.array_equal(x, y) and x.gpu == 1
    assert [c[0] for c in fake.calls] == ["synchronize"]


def test_copy_stream_keeps_y_alive_until_its_slot_is_written_again(monkeypatch):
    fake = FakeCupy()
    with installed(monkeypatch, fake):
        a, b = ToyGPUStage(fake, 0, 1.0, "p2p", True), ToyGPUStage(fake, 1, 2.0, "p2p")
        ys = [a.run(ChunkJob(0, i, 0, 2, np.arange(2) + i), np.arange(2) + i) for i in range(2)]
        buf = a.alloc_handoff(ys[0].shape, ys[0].dtype)
        a.to_handoff(ys[0], buf)
        assert buf.state.src is ys[0]
        first_written = buf.state.written
        b.from_handoff(buf)
        n = len(fake.calls)
        a.to_handoff(ys[1], buf)
    assert buf.state.src is ys[1]
    waits = [c for c in fake.calls[n:] if c[0] == "wait"]
    # the compute stream waits for the old copy before y[0] may be freed
    assert waits[0][1] is a.stream and waits[0][2] is first_written


def test_configure_rejects_unknown_modes(monkeypatch):
    fake = FakeCupy()
    with pytest.raises(ValueError, match="hand-off mode"):
        ToyGPUStage(fake, 0, 1.0, "auto")


# --- how the resolved mode reaches the backends (lite/engine/engine.py -> lite/engine/stage.py) ---

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from lite.files.synth import synth
    path = tmp_path_factory.mktemp("synth") / "llama-Q8_0.gguf"
    synth("llama", "tiny", "Q8_0", str(path), seed=1)
    return str(path)


def test_stage_configures_its_backend_only_off_the_default(tiny_llama):
    from lite.backends.cpu import CPUBackend
    from lite.files.config import ModelConfig
    from lite.files.gguf_file import GGUFFile
    from lite.engine.stage import Stage, split_layers
    calls = []

    class Recording(CPUBackend):
        def configure_handoff(self, mode, copy_stream):
            calls.append((mode, copy_stream))

    g = GGUFFile(tiny_llama)
    cfg = ModelConfig.from_gguf(g.metadata, g.path)
    spec = split_layers(cfg.n_layer, 2)[0]
    Stage(g, cfg, spec, Recording, 16, "f16")
    assert calls == []                                      # host, no copy stream: as before
    Stage(g, cfg, spec, Recording, 16, "f16", handoff="p2p")
    Stage(g, cfg, spec, Recording, 16, "f16", handoff="host", handoff_stream=True)
    assert calls == [("p2p", False), ("host", True)]


def test_engine_hands_the_resolved_mode_to_every_stage(tiny_llama, monkeypatch):
    from lite.engine import engine as eng
    seen, asked = [], []

    class Recording(eng.Stage):
        def __init__(self, *a, **kw):
            seen.append((kw["handoff"], kw["handoff_stream"]))
            kw.update(handoff="host", handoff_stream=False)     # the CPU backend has neither
            super().__init__(*a, **kw)

    def resolve(mode, devs, backend, can, stream):
        asked.append((mode, stream))
        return "p2p"
    monkeypatch.setattr(eng, "Stage", Recording)
    monkeypatch.setattr(eng, "resolve_handoff", resolve)
    e = eng.Engine(tiny_llama, device="cpu", max_context=16, layer_split=2, handoff="auto",
                   handoff_stream=True)
    assert asked == [("auto", True)] and e.handoff == "p2p"
    assert seen == [("p2p", True)] * 2
