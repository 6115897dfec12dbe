"""The Python API on the real SmolLM2 model, CPU backend; and one LLM used from many threads at
once: requests queue, each gets the text it gets alone, and abandoned streams give the engine back."""
import gc
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lite import LLM, ContextOverflowError, LiteError
from conftest import real_model

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "generate.json").read_text())["smollm2"]


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


# --- one LLM from many threads (its own, with a shorter context) ---

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village",
           "Chapter 1. The lighthouse keeper", "Water boils at", "My favourite colour is",
           "import numpy as np\n", "Three primary colours are"]
TIMEOUT = 600


@pytest.fixture(scope="module")
def shared_llm():
    return LLM(real_model("smollm2"), device="cpu", max_context=256)


def test_eight_threads_each_get_their_single_thread_text(shared_llm):
    alone = {}
    for p in PROMPTS:
        alone[p] = shared_llm.generate(p, max_tokens=32, temperature=0)
    start = threading.Barrier(len(PROMPTS))

    def one(p):
        start.wait(timeout=60)
        return shared_llm.generate(p, max_tokens=32, temperature=0)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = {p: pool.submit(one, p) for p in reversed(PROMPTS)}
        got = {p: f.result(timeout=TIMEOUT) for p, f in futures.items()}
    assert got == alone
    assert all(alone.values())


def test_an_abandoned_stream_releases_the_engine(shared_llm):
    it = shared_llm.stream("Once upon a time", max_tokens=32, temperature=0)
    next(it)                             # holds the engine now
    assert shared_llm._lock.locked()
    with pytest.raises(LiteError, match="unfinished stream"):
        shared_llm.generate("hi", max_tokens=2)  # the same thread would wait for itself: an error instead
    del it
    gc.collect()
    assert not shared_llm._lock.locked()
    for piece in shared_llm.stream("Once upon a time", max_tokens=32, temperature=0):
        break                            # leaving the loop drops the stream
    assert not shared_llm._lock.locked()
    it = shared_llm.stream("Once upon a time", max_tokens=32, temperature=0)
    next(it)
    done = []
    t = threading.Thread(target=lambda: done.append(shared_llm.generate("Hello", max_tokens=2, temperature=0)))
    t.start()
    t.join(0.5)
    assert not done                       # waits for the open stream
    it.close()
    t.join(TIMEOUT)
    assert done and not shared_llm._lock.locked()
