"""Splitting the layers into stages changes no byte. On the CPU backend: 1, 2, 3 and 4 stages at a
fixed chunk size, for a dense and a MoE synthetic model (issue 5), in both pipeline modes. Across
real GPUs (issue 7): one stage per GPU must give the same bytes as one GPU; those tests skip unless
the machine has at least two usable GPUs."""
import numpy as np
import pytest

from lite.backend_config import BackendConfig
from lite.backends import cuda_unavailable_reason
from lite.engine import Engine
from lite.sampling import Sampler, SamplingParams
from lite.synth import synth

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
    ids = list(range(7, 60))
    greedy = Sampler(SamplingParams.greedy())
    ref_logits = ref_tokens = None
    for stages in (1, 2, 3, 4):
        e = Engine(cpu_model, device="cpu", max_context=128, prefill_chunk=8, layer_split=stages,
                   pipeline=mode)
        assert len(e.stages) == stages
        logits = e.prefill(ids, all_logits=True)
        e.cached_ids = []
        tokens = list(e.generate(ids, 6, greedy, stop_at_eog=False))
        if ref_logits is None:
            ref_logits, ref_tokens = logits, tokens
        else:
            assert np.array_equal(logits, ref_logits), stages
            assert tokens == ref_tokens, stages


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
