"""The Python API on the real SmolLM2 model, CPU backend."""
import json
from pathlib import Path

import pytest

from lite import LLM, ContextOverflowError
from realmodels import real_model

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "generate_smollm2.json").read_text())


@pytest.fixture(scope="module")
def llm():
    return LLM(real_model("smollm2"), device="cpu", max_context=512)


def test_generate_greedy_matches_reference(llm):
    case = FIXTURE["cases"][0]
    text = llm.generate(case["text"], max_tokens=12, temperature=0)
    assert text == llm.detokenize(case["generated"][:12])


def test_stream_pieces_join_to_generate(llm):
    pieces = list(llm.stream("Once upon a time", max_tokens=10, temperature=0))
    assert len(pieces) > 1
    assert "".join(pieces) == llm.generate("Once upon a time", max_tokens=10, temperature=0)


def test_prefix_cache_reuse_gives_the_same_answer(llm):
    prompt = "The quick brown fox jumps over the lazy dog. " * 3
    a = llm.generate(prompt, max_tokens=6, temperature=0)
    b = llm.generate(prompt + "Then", max_tokens=6, temperature=0)
    assert llm.last_stats.reused_tokens > 0          # the shared prefix came from the cache
    llm.engine.cached_ids = []
    assert llm.generate(prompt + "Then", max_tokens=6, temperature=0) == b
    assert a                                            # the first answer was produced


def test_seeded_sampling_repeats(llm):
    a = llm.generate("Tell me about cats.", max_tokens=8, temperature=0.9, seed=11)
    b = llm.generate("Tell me about cats.", max_tokens=8, temperature=0.9, seed=11)
    assert a == b


def test_chat_uses_the_template_and_stops_at_end_of_turn(llm):
    msgs = [{"role": "user", "content": "Say hello."}]
    prompt = llm.chat_prompt(msgs)
    assert prompt.endswith("<|im_start|>assistant\n")
    answer = llm.chat(msgs, max_tokens=64, temperature=0)
    assert answer and "<|im_end|>" not in answer
    assert llm.last_stats.stop_reason in ("eog", "length")


def test_tokenize_detokenize(llm):
    ids = llm.tokenize("Hello, world!", add_special=False)
    assert llm.detokenize(ids) == "Hello, world!"


def test_prompt_too_long_is_an_error_before_work(llm):
    with pytest.raises(ContextOverflowError, match="context of 512"):
        llm.generate("word " * 600, max_tokens=4)


def test_unknown_sampling_option(llm):
    with pytest.raises(TypeError, match="temprature"):
        llm.generate("hi", max_tokens=2, temprature=0.5)
