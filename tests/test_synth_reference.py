"""lite's CPU forward on the tiny synthetic llama, qwen3, qwen3moe and qwen2moe files against
llama.cpp (fixtures from tests/make_synth_fixtures.py): the logits of llama.cpp's top 10 at the last
position, and 8 greedy tokens. For qwen3moe this is the independent check of the MoE forward; for
qwen2moe, of the attention biases, the un-renormalized top-k weights and the gated shared expert
(leaving out any one of them moves these logits by 0.08 or more; see lite/synth_qwen2moe.py); for
gemma3, of the synthetic layout itself (llama.cpp loads it as Gemma 3) and the forward with head dim
256, post norms and a sliding window of 16 that the greedy steps pass (12 + 8 positions)."""
import json
from pathlib import Path

import numpy as np
import pytest

from lite.engine import Engine
from lite.sampling import Sampler, SamplingParams
from lite.synth import synth

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3moe", "qwen2moe", "gemma3"])
def test_cpu_forward_matches_llamacpp(arch, tmp_path):
    fx = json.loads((FIXTURES / f"synth_{arch}.json").read_text())
    path = tmp_path / f"{arch}.gguf"
    synth(fx["arch"], fx["preset"], fx["quant"], str(path), seed=fx["seed"])
    engine = Engine(str(path), device="cpu", max_context=64)
    ids = fx["token_ids"]
    logits = engine.prefill(ids)
    ours = logits[fx["top_ids"]]
    # llama.cpp quantizes activations to 8 bits in its CPU dot products; the logits here are ~1.0
    np.testing.assert_allclose(ours, fx["top_logits"], atol=0.03)
    assert int(np.argmax(logits)) == fx["top_ids"][0]
    engine.cached_ids = []
    got = list(engine.generate(ids, len(fx["greedy"]), Sampler(SamplingParams.greedy()),
                               stop_at_eog=False))
    assert got == fx["greedy"]
    if "end_top_ids" in fx:         # the logits after the greedy tokens (gemma3: past its window)
        engine.cached_ids = []
        engine.prefill(ids)
        for t in fx["greedy"]:
            last = engine.decode_step(t)
        np.testing.assert_allclose(last[fx["end_top_ids"]], fx["end_top_logits"], atol=0.03)
