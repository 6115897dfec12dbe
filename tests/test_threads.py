"""One LLM used from many threads at once: requests queue, each gets the text it gets alone, and
abandoned streams give the engine back."""
import gc
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from lite import LLM, LiteError
from realmodels import real_model

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village",
           "Chapter 1. The lighthouse keeper", "Water boils at", "My favourite colour is",
           "import numpy as np\n", "Three primary colours are"]
TIMEOUT = 600


@pytest.fixture(scope="module")
def llm():
    return LLM(real_model("smollm2"), device="cpu", max_context=256)


def test_eight_threads_each_get_their_single_thread_text(llm):
    alone = {}
    for p in PROMPTS:
        alone[p] = llm.generate(p, max_tokens=32, temperature=0)
    start = threading.Barrier(len(PROMPTS))

    def one(p):
        start.wait(timeout=60)
        return llm.generate(p, max_tokens=32, temperature=0)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = {p: pool.submit(one, p) for p in reversed(PROMPTS)}
        got = {p: f.result(timeout=TIMEOUT) for p, f in futures.items()}
    assert got == alone
    assert all(alone.values())


def test_an_abandoned_stream_releases_the_engine(llm):
    it = llm.stream("Once upon a time", max_tokens=32, temperature=0)
    next(it)                             # holds the engine now
    assert llm._lock.locked()
    with pytest.raises(LiteError, match="unfinished stream"):
        llm.generate("hi", max_tokens=2)  # the same thread would wait for itself: an error instead
    del it
    gc.collect()
    assert not llm._lock.locked()
    for piece in llm.stream("Once upon a time", max_tokens=32, temperature=0):
        break                            # leaving the loop drops the stream
    assert not llm._lock.locked()
    it = llm.stream("Once upon a time", max_tokens=32, temperature=0)
    next(it)
    done = []
    t = threading.Thread(target=lambda: done.append(llm.generate("Hello", max_tokens=2, temperature=0)))
    t.start()
    t.join(0.5)
    assert not done                       # waits for the open stream
    it.close()
    t.join(TIMEOUT)
    assert done and not llm._lock.locked()
