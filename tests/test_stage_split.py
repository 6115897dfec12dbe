"""Byte-identical outputs for 1, 2, 3 and 4 stages at a fixed chunk size, on the CPU backend, for a
dense and a MoE synthetic model (issue 5), in both pipeline modes."""
import numpy as np
import pytest

from lite.engine import Engine
from lite.sampling import Sampler, SamplingParams
from lite.synth import synth


@pytest.fixture(scope="module", params=[("llama", "Q4_K"), ("qwen3moe", "Q4_K")],
                ids=lambda p: p[0])
def model(request, tmp_path_factory):
    arch, quant = request.param
    path = tmp_path_factory.mktemp("split") / f"{arch}.gguf"
    synth(arch, "tiny", quant, str(path), seed=2)
    return str(path)


@pytest.mark.parametrize("mode", ["chain", "sync"])
def test_stage_counts_give_identical_bytes(model, mode):
    ids = list(range(7, 60))
    greedy = Sampler(SamplingParams.greedy())
    ref_logits = ref_tokens = None
    for stages in (1, 2, 3, 4):
        e = Engine(model, device="cpu", max_context=128, prefill_chunk=8, layer_split=stages,
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
