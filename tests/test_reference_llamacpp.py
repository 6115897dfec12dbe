"""The CPU reference against llama.cpp, and in every quant type.

On the real models (fixtures from tests/make_llamacpp_fixtures.py generation): the same prompt token ids,
the same greedy continuation, and top-5 logits close.

On the tiny synthetic llama, qwen3, qwen3moe, qwen2moe and gemma3 files (fixtures from
tests/make_llamacpp_fixtures.py synth): the logits of llama.cpp's top 10 at the last position, and 8 greedy
tokens. For qwen3moe this is the independent check of the MoE forward; for qwen2moe, of the
attention biases, the un-renormalized top-k weights and the gated shared expert (leaving out any one
of them moves these logits by 0.08 or more; see lite/files/synth_archs.py); for gemma3, of the
synthetic layout itself (llama.cpp loads it as Gemma 3) and the forward with head dim 256, post
norms and a sliding window of 16 that the greedy steps pass (12 + 8 positions).

Every quant type the gguf package dequantizes runs on the CPU path: a tiny synthetic llama in each
type gives finite logits, and its weights dequantize exactly as gguf-py does."""
import json
from pathlib import Path

import numpy as np
import pytest
from gguf import quants as gguf_quants

from lite.backends.cpu import dequantize_tensor
from lite.engine.engine import Engine
from lite.files.gguf_file import GGUFFile
from lite.engine.sampling import Sampler, SamplingParams
from lite.files.synth import QUANT_TYPES, synth
from conftest import real_model

FIXTURES = Path(__file__).parent / "fixtures"


def load(key):
    p = FIXTURES / "generate.json"
    docs = json.loads(p.read_text()) if p.exists() else {}
    if key not in docs:
        pytest.skip(f"{p.name} has no {key} yet (tests/make_llamacpp_fixtures.py generation)")
    return docs[key]


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


# --- the tiny synthetic files against llama.cpp ---

@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3moe", "qwen2moe", "gemma3"])
def test_cpu_forward_matches_llamacpp(arch, tmp_path):
    fx = json.loads((FIXTURES / "synth.json").read_text())[arch]
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


# --- every quant type on the CPU path ---

@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_tiny_model_in_every_type(qtype, tmp_path):
    path = tmp_path / f"tiny-{qtype}.gguf"
    synth("llama", "tiny", qtype, str(path), seed=1)
    g = GGUFFile(path)
    t = g.tensors["blk.0.ffn_down.weight"]
    assert t.type_name == qtype
    want = gguf_quants.dequantize(t.raw.reshape(t.shape[0], -1), t.qtype)
    assert np.array_equal(dequantize_tensor(t), want.astype(np.float32))
    logits = Engine(str(path), device="cpu", max_context=32).prefill([5, 17, 99, 3])
    assert logits.shape == (512,) and np.all(np.isfinite(logits))
