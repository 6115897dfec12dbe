"""`lite serve` as its users use it: a subprocess on 127.0.0.1 and the official openai client.
SmolLM2 on the CPU; every loop is bounded in count and time."""
import contextlib
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from lite import LLM  # noqa: E402
from realmodels import real_model  # noqa: E402
from serve_helpers import ServerProcess, httpx  # noqa: E402

KEY = "test-key"
ALIAS = "smol"
CTX = 256
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The sun is",
           "My favourite food is", "1, 2, 3, 4,", "Water boils at", "The best way to learn is"]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(real_model("smollm2"), "-np", "4", "-c", str(CTX), "--max-queue", "4",
                        "--alias", ALIAS, api_key=KEY)
    try:
        srv.seen_status = srv.wait_ready()
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def llm():
    return LLM(real_model("smollm2"), device="cpu", max_context=CTX)


def complete(client, prompt, n=6, **kw):
    return client.completions.create(model=ALIAS, prompt=prompt, max_tokens=n, temperature=0, **kw)


def streamed_text(stream, chat):
    parts = []
    for ch in stream:
        if ch.choices:
            parts.append((ch.choices[0].delta.content if chat else ch.choices[0].text) or "")
    return "".join(parts)


def test_health_and_models(server, client):
    assert server.seen_status <= {503, 200} and 200 in server.seen_status
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}    # no key needed
    assert [m.id for m in client.models.list()] == [ALIAS]


def test_chat_streamed_equals_whole_equals_llm(client, llm):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model=ALIAS, messages=msgs, max_tokens=8, temperature=0)
    stream = client.chat.completions.create(model=ALIAS, messages=msgs, max_tokens=8, temperature=0,
                                            stream=True)
    text = whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant"
    assert text and streamed_text(stream, True) == text
    assert llm.chat(msgs, max_tokens=8, temperature=0) == text


def test_completion_streamed_equals_whole_equals_llm(client, llm):
    whole = complete(client, PROMPTS[0]).choices[0].text
    assert streamed_text(complete(client, PROMPTS[0], stream=True), False) == whole
    assert llm.generate(PROMPTS[0], max_tokens=6, temperature=0) == whole


def test_stream_events_follow_openai(server):
    body = {"model": ALIAS, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with server.http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: "):]) for ln in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(final) == 1 and final[0]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= 4


def test_same_seed_same_text(client):
    def sample(seed):
        return client.completions.create(
            model=ALIAS, prompt=PROMPTS[1], max_tokens=8, temperature=1.0, seed=seed,
            extra_body={"top_k": 0, "min_p": 0.0}).choices[0].text
    assert sample(7) == sample(7)


def test_concurrent_requests_get_their_alone_texts(client, llm):
    alone = [llm.generate(p, max_tokens=6, temperature=0) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: complete(client, p).choices[0].text, PROMPTS))
    assert got == alone


def test_stop_split_across_tokens_is_cut(client, llm):
    pieces = list(llm.stream(PROMPTS[1], max_tokens=16, temperature=0))
    full = "".join(pieces)

    def split_stop(i):              # the last two characters of token i and the first two of i+1
        at = len("".join(pieces[:i + 1])) - 2
        stop = pieces[i][-2:] + pieces[i + 1][:2]
        ok = len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2 and full.find(stop) == at
        return stop if ok else None
    stop = next(s for s in map(split_stop, range(len(pieces) - 1)) if s)
    expected = full[:full.find(stop)]
    r = complete(client, PROMPTS[1], n=16, stop=[stop])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    assert streamed_text(complete(client, PROMPTS[1], n=16, stop=stop, stream=True), False) == expected


def test_usage_counts(client, llm):
    r = complete(client, PROMPTS[3], n=5)
    u = r.usage
    assert u.prompt_tokens == len(llm.tokenize(PROMPTS[3]))
    assert u.completion_tokens == 5 and u.total_tokens == u.prompt_tokens + 5
    assert r.choices[0].finish_reason == "length"


def test_repeated_prompt_reports_cached_tokens(client):
    prompt = "A unique preamble for the cache test, long enough for two blocks of sixteen. " * 2
    first = complete(client, prompt, n=3)
    again = complete(client, prompt, n=3)
    n = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16 > 0
    assert again.choices[0].text == first.choices[0].text


def _err(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and "type" in err
    return err


def test_errors_in_openai_shape(server):
    http = server.http
    _err(http.post("/v1/completions", content=b"{not json"), 400)
    e = _err(http.post("/v1/completions", json={"prompt": "x", "temperature": "hot"}), 400)
    assert e["param"] == "temperature"
    _err(http.post("/v1/chat/completions", json={"messages": "hello"}), 400)
    e = _err(http.post("/v1/completions", json={"prompt": "word " * (CTX + 10)}), 400)
    assert e["code"] == "context_length_exceeded" and e["n_ctx"] == CTX and e["n_prompt_tokens"] > CTX
    _err(httpx.post(server.url + "/v1/completions", json={"prompt": "x"},
                    headers={"Authorization": "Bearer wrong"}), 401)
    _err(http.get("/v1/no-such-route"), 404)
    e = _err(http.post("/v1/completions", json={"model": "no-such-model", "prompt": "x"}), 404)
    assert e["code"] == "model_not_found"


def test_openai_client_sees_the_errors(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        good.completions.create(model="no-such-model", prompt="x", max_tokens=1)


def test_full_queue_503_and_closed_streams_free_their_slots(server):
    """4 slots and a queue of 4: a ninth request gets 503; closing the streams frees everything."""
    body = {"model": ALIAS, "prompt": PROMPTS[4], "max_tokens": 200, "temperature": 0, "stream": True}
    with contextlib.ExitStack() as held:
        streams = [held.enter_context(server.http.stream("POST", "/v1/completions", json=body))
                   for _ in range(8)]
        assert all(s.status_code == 200 for s in streams)
        e = _err(server.http.post("/v1/completions", json={**body, "stream": False}), 503)
        assert e["code"] == "queue_full"
        first = next(streams[0].iter_lines())                 # a running one has started
        assert first.startswith("data: ")
        # the scheduler admits waiting requests between steps, so the slots fill within a few steps
        m = server.wait_metrics(lambda m: m["lite_slots_busy"] == 4, timeout=60)
        assert m["lite_slots_busy"] == 4 and m["lite_queue_length"] == 4
    m = server.wait_idle(timeout=60)                          # every stream closed early
    assert m["lite_slots_busy"] == 0 and m["lite_queue_length"] == 0
    assert m["lite_kv_blocks_free"] == m["lite_kv_blocks_total"]
    assert m["lite_requests_cancelled_total"] >= 8


def test_tokenize_and_detokenize(server, llm):
    ids = server.http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert ids == llm.tokenizer.encode("Hello world", add_special=False)
    assert server.http.post("/detokenize", json={"tokens": ids}).json()["content"] == "Hello world"


def test_metrics_count_tokens(server):
    m = server.metrics()
    assert m["lite_requests_total"] >= m["lite_requests_finished_total"] > 0
    assert m["lite_generated_tokens_total"] > 0 and m["lite_prompt_tokens_cached_total"] > 0
    assert m["lite_slots_total"] == 4
