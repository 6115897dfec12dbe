"""qwen3next on the GPU (the GPU machine; every test here skips elsewhere with its reason): the
CUDA backend against the CPU reference of tests/test_qwen3next.py, and the graphed decode of
BackendConfig.hybrid_graphs against eager decode (in CI, emulated: tests/test_hybrid_decode_emulated.py).
"""
import numpy as np
import pytest

from lite.backends import cuda_unavailable_reason
from lite.engine.engine import Engine
from conftest import assert_stage_counts_agree  # noqa: F401  (used where the GPU runs)
from test_qwen3next import (GGUF, GREEDY, chunked_logits, engine, fixture, ref,  # noqa: F401  (fixtures)
                            rel_err)
from test_qwen3next_chain import synth_tiny  # noqa: F401  (the fixture)

# --- the GPU against the CPU (the GPU machine; skipped elsewhere) -------------------------------
# The CUDA backend rounds each product's input to f16 (cuBLAS over f16, fp32 accumulation) and
# keeps an f16 KV cache: on the CPU that rounding moves this prompt's logits by 4e-3 of the largest.
GPU_WHY = cuda_unavailable_reason()
on_gpu = pytest.mark.skipif(GPU_WHY is not None, reason=f"needs a GPU: {GPU_WHY}")
GPU_TOL = 1e-2


def gpu_engine(path=GGUF, **kw):
    kw.setdefault("prefill_chunk", 512)
    return Engine(path, device="cuda", max_context=256, kv="f16", **kw)


@on_gpu
def test_gpu_matches_cpu_whole_chunked_and_greedy(ref):
    """The fixture prompt whole and in chunks of 1 (the decode kernels), 37, 64 and 48; then 64
    greedy tokens (the decode path): all equal to the CPU's."""
    ids = [int(i) for i in ref["ids"]]
    want = engine().prefill(ids, all_logits=True)
    assert rel_err(gpu_engine().prefill(ids, all_logits=True), want) < GPU_TOL
    assert rel_err(chunked_logits(gpu_engine(), ids, (1, 37, 64, 48)), want) < GPU_TOL
    import cupy
    e = gpu_engine()
    assert all(isinstance(s, cupy.ndarray) for s in e.stages[0].kv.recurrent.ssm.values())
    got = list(e.generate(ids, 64, GREEDY, stop_at_eog=False))
    assert got == list(engine().generate(ids, 64, GREEDY, stop_at_eog=False))
    assert e.stages[0].kv.recurrent.at() == len(ids) + 63      # the last token is not run


@on_gpu
def test_gpu_chat_second_turn_restores_the_checkpoint(ref):
    """The states' checkpoint copied and restored on the device (in the stage's stream order): the
    second turn prefills only its new 35 tokens, to the bytes of a fresh engine's same chunks."""
    ids = [int(i) for i in ref["ids"]]
    e = gpu_engine()
    reply = list(e.generate(ids[:60], 8, GREEDY, stop_at_eog=False))
    second = ids[:60] + reply[:5] + ids[60:90]
    got = e.prefill(second)
    assert e.last_reuse == 60 and len(second) - e.last_reuse == 35
    fresh = gpu_engine()
    fresh._prefill_chain(second[:60], 0, False)
    np.testing.assert_array_equal(got, fresh._prefill_chain(second[60:], 60, False)[-1][-1])


@on_gpu
@pytest.mark.parametrize("which", ["fixture", "synth"])
def test_gpu_stage_counts_give_identical_bytes(which, synth_tiny):
    """1, 2 and 4 virtual stages on one GPU: the same logits and tokens byte for byte (no lazy
    value crosses a stage here: every layer ends in a plain add)."""
    path = GGUF if which == "fixture" else synth_tiny
    assert_stage_counts_agree(lambda stages: gpu_engine(path, prefill_chunk=16, layer_split=stages),
                              list(range(7, 60)), 8, counts=(1, 2, 4))


def mostly_close(got, want):
    """Random weights: a router near a tie may choose another expert for a token where rounding
    differs, so most logits (as tests/test_cuda_backend.py's compare), not all, and the last
    position's choice."""
    close = np.isclose(got, want, rtol=GPU_TOL, atol=GPU_TOL * np.abs(want).max())
    assert close.mean() > 0.95, close.mean()
    assert int(np.argmax(got[-1])) == int(np.argmax(want[-1]))


@on_gpu
def test_gpu_matches_cpu_on_the_synth_tiny(synth_tiny):
    """Q4_K weights: the quantized products, the grouped experts (pairs, sorted by chunk size)."""
    ids = list(range(5, 45))
    cpu, gpu = (Engine(synth_tiny, device=d, max_context=128, kv="f16", prefill_chunk=16)
                for d in ("cpu", "cuda"))
    mostly_close(gpu.prefill(ids, all_logits=True), cpu.prefill(ids, all_logits=True))


@on_gpu
def test_gpu_matches_cpu_on_the_80b_layout(tmp_path):
    """Qwen3-Next-80B-A3B's shapes in its first 4 layers (3 Gated DeltaNet, 1 gated attention: head
    dim 256 with 64 rotated, dk 128, 32 value heads on 16 key heads, 512 experts, top 10), Q4_0 (the
    CPU dequantizes it fastest): a short prompt and 2 decode steps."""
    from lite.files.synth import synth
    path = str(tmp_path / "q3n-80b-4l.gguf")
    synth("qwen3next", "80b-a3b", "Q4_0", path, seed=1, n_layer=4)
    ids = list(range(1000, 1008))
    runs = []
    for device in ("cpu", "cuda"):
        e = Engine(path, device=device, max_context=64, kv="f16", prefill_chunk=16)
        rows = list(e.prefill(ids, all_logits=True))
        for _ in range(2):
            rows.append(e.decode_step(int(np.argmax(rows[-1]))))
        runs.append(np.stack(rows))
    mostly_close(runs[1][:len(ids)], runs[0][:len(ids)])
    mostly_close(runs[1], runs[0])


# --- graphed decode (BackendConfig.hybrid_graphs; in CI: tests/test_hybrid_decode_emulated.py) -----
def graphed_engine(path, graphs, config=None, **kw):
    """hybrid_graphs on (the fused kernels); graphs off: the same kernels launched eagerly."""
    from lite.backend_config import BackendConfig
    e = gpu_engine(path, prefill_chunk=16, config=config or BackendConfig(hybrid_graphs=True), **kw)
    for st in e.stages:
        assert st.use_graphs or not graphs, "hybrid_graphs on, yet a stage does not capture"
        st.use_graphs = graphs
    return e


def teacher_forced(e, ids, tokens):
    """The prompt's last logits, then those of each of tokens in turn (None: greedy, 64 steps)."""
    rows = [e.prefill(ids)]
    for i in range(64 if tokens is None else len(tokens)):
        rows.append(np.array(e.decode_step(int(np.argmax(rows[-1])) if tokens is None else tokens[i])))
    return np.stack(rows)


@on_gpu
@pytest.mark.parametrize("split", [None, 2])
def test_gpu_graphed_decode_equals_eager_byte_for_byte(synth_tiny, split):
    """64 greedy tokens: logits and recurrent states of the replayed graphs = the same kernels run
    eagerly, byte for byte; within GPU_TOL of the unfused eager path fed the same tokens."""
    import cupy
    from lite.backend_config import BackendConfig
    ids, runs = list(range(7, 60)), {}
    for graphs in (True, False):
        e = graphed_engine(synth_tiny, graphs, layer_split=split)
        runs[graphs] = teacher_forced(e, ids, None), [cupy.asnumpy(a) for st in e.stages
                                                     for d in (st.kv.recurrent.conv, st.kv.recurrent.ssm)
                                                     for a in d.values()]
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    for a, b in zip(runs[True][1], runs[False][1]):
        np.testing.assert_array_equal(a, b)
    tokens = [int(np.argmax(r)) for r in runs[True][0][:64]]
    unfused = teacher_forced(graphed_engine(synth_tiny, False, BackendConfig(), layer_split=split), ids, tokens)
    assert rel_err(runs[True][0], unfused) < GPU_TOL


@on_gpu
def test_gpu_checkpoint_reuse_after_graphed_decode(synth_tiny):
    """After 8 graphed tokens a turn extending the history reuses the states where they stand, one
    branching inside the reply restores the prompt's checkpoint: the bytes of eager decode."""
    ids, runs = list(range(7, 97)), {}
    for graphs in (True, False):
        e = graphed_engine(synth_tiny, graphs)
        rows = [e.prefill(ids[:60])]
        for _ in range(8):
            rows.append(np.array(e.decode_step(int(np.argmax(rows[-1])))))
        reply = [int(np.argmax(r)) for r in rows[:8]]
        second = e.prefill(ids[:60] + reply + ids[60:70])
        reuse = [e.last_reuse]
        third = e.prefill(ids[:60] + reply[:5] + ids[60:90])
        runs[graphs] = np.stack(rows), second, third, reuse + [e.last_reuse]
    assert runs[True][3] == runs[False][3] == [68, 60]
    for a, b in zip(runs[True][:3], runs[False][:3]):
        np.testing.assert_array_equal(a, b)
