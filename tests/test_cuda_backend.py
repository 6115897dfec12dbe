"""The GPU backend against the CPU reference, on the real small models (runs on the GPU machine)."""
import json
from pathlib import Path

import numpy as np
import pytest

from lite.backends import cuda_unavailable_reason
from lite.engine import Engine
from lite.sampling import Sampler, SamplingParams
from realmodels import real_model

WHY = cuda_unavailable_reason()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"needs a GPU: {WHY}")
FIXTURES = Path(__file__).parent / "fixtures"


def prompts(key):
    p = FIXTURES / f"generate_{key}.json"
    if p.exists():
        return [(c["prompt_ids"], len(c["generated"])) for c in json.loads(p.read_text())["cases"]]
    pytest.skip(f"{p.name} not made yet")


@pytest.mark.parametrize("key", ["smollm2", "gemma3"])
@pytest.mark.parametrize("kv", ["f16"])
def test_gpu_matches_cpu(key, kv):
    path = real_model(key)
    cpu = Engine(path, device="cpu", max_context=512, kv=kv)
    gpu = Engine(path, device="cuda", max_context=512, kv=kv)
    greedy = Sampler(SamplingParams.greedy())
    for ids, n in prompts(key):
        lc = cpu.prefill(ids, all_logits=True)
        lg = gpu.prefill(ids, all_logits=True)
        scale = np.abs(lc).max()
        np.testing.assert_allclose(lg, lc, rtol=1e-2, atol=1e-2 * scale)
        cpu.cached_ids, gpu.cached_ids = [], []
        want = list(cpu.generate(ids, n, greedy, stop_at_eog=False))
        got = list(gpu.generate(ids, n, greedy, stop_at_eog=False))
        assert got == want


@pytest.mark.parametrize("split", [[10, 10, 10], [1, 29]])
def test_gpu_virtual_stages_identical(split):
    path = real_model("smollm2")
    ids = prompts("smollm2")[0][0] * 3
    one = Engine(path, device="cuda", max_context=512, prefill_chunk=7)
    many = Engine(path, device="cuda", max_context=512, prefill_chunk=7, layer_split=split)
    a = one.prefill(ids, all_logits=True)
    b = many.prefill(ids, all_logits=True)
    assert np.array_equal(a, b)
