"""The CPU reference against llama.cpp (fixtures from tests/make_generation_fixtures.py):
the same prompt token ids, the same greedy continuation, and top-5 logits close."""
import json
from pathlib import Path

import numpy as np
import pytest

from lite.engine import Engine
from lite.sampling import Sampler, SamplingParams
from realmodels import real_model

FIXTURES = Path(__file__).parent / "fixtures"


def load(key):
    p = FIXTURES / f"generate_{key}.json"
    if not p.exists():
        pytest.skip(f"{p.name} not made yet (tests/make_generation_fixtures.py)")
    return json.loads(p.read_text())


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def case_set(request):
    doc = load(request.param)
    engine = Engine(real_model(request.param), device="cpu", max_context=1024, kv="f16")
    return request.param, doc, engine


def test_prompts_tokenize_like_llamacpp(case_set):
    _, doc, engine = case_set
    for case in doc["cases"]:
        if case["kind"] == "chat":
            assert engine.tokenizer.apply_chat_template(case["messages"]) == case["text"]
        assert engine.tokenizer.encode(case["text"]) == case["prompt_ids"], case["text"]


def test_greedy_continuation_matches(case_set):
    key, doc, engine = case_set
    greedy = Sampler(SamplingParams.greedy())
    for case in doc["cases"]:
        want = case["generated"]
        got = list(engine.generate(case["prompt_ids"], len(want), greedy, stop_at_eog=False))
        assert got == want, (key, case["text"], engine.tokenizer.decode(got), case["generated_text"])


def test_top5_logits_match(case_set):
    _, doc, engine = case_set
    for case in doc["cases"]:
        engine.cached_ids = []      # no prefix reuse: logits of a fresh prefill
        logits = engine.prefill(case["prompt_ids"])
        ours = logits[case["top5_ids"]]
        np.testing.assert_allclose(ours, case["top5_logits"], rtol=1e-2, atol=1e-2 * np.abs(ours).max())
        assert [int(i) for i in np.argsort(-logits)[:1]] == case["top5_ids"][:1]
