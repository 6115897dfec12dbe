"""`lite serve` as its users use it: a subprocess on 127.0.0.1 at a free port and the official openai
client, SmolLM2 on the CPU; every loop is bounded in count and time. At the end, the server under
load: 300 requests from 32 concurrent clients, a third of them cancelled mid-stream, one in ten
malformed and one in ten constrained by a grammar. The server stays up, every well-formed request
gets the text it gets alone (a constrained one, text of its grammar), no slot or KV block leaks,
and its memory does not grow from the first 100 requests to the last 100. Bounded: tiny outputs,
every request with a timeout."""
import contextlib
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from lite import LLM  # noqa: E402
from lite.backends import cuda_unavailable_reason  # noqa: E402
from conftest import real_model  # noqa: E402

from live_server import ServerProcess, httpx, running  # noqa: E402


# --- the server as its users use it ---

KEY = "test-key"
ALIAS = "smol"
CTX = 256
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The sun is",
           "My favourite food is", "1, 2, 3, 4,", "Water boils at", "The best way to learn is"]


@pytest.fixture(scope="module")
def server():
    with running(real_model("smollm2"), "-np", "4", "-c", str(CTX), "--max-queue", "4",
                 "--alias", ALIAS, api_key=KEY) as srv:
        yield srv


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


def test_seeded_requests_under_load_get_their_lone_texts(client):
    # temperature 0.8 and seed 14: the draws follow the logits, which the batch must not change
    def sample(prompt):
        return client.completions.create(model=ALIAS, prompt=prompt, max_tokens=12, temperature=0.8,
                                         seed=14).choices[0].text
    alone = [sample(p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        assert list(pool.map(sample, PROMPTS)) == alone


def test_a_seeded_prompt_from_the_prefix_cache_gets_its_uncached_text(client):
    # longer than two KV blocks, so the second request runs only the tail its cached head leaves;
    # with this seed the first draw parts if the tail's logits differ from the whole prompt's at all
    prompt = ("Here is a list of the ten most popular programming languages, with one sentence about "
              "each of them, written for a reader who has never written any code before in their life: 1.")

    def sample():
        r = client.completions.create(model=ALIAS, prompt=prompt, max_tokens=8, temperature=0.8,
                                      seed=226)
        return r.choices[0].text, r.usage.prompt_tokens_details.cached_tokens
    (first, cached_first), (again, cached_again) = sample(), sample()
    assert cached_first == 0 and cached_again >= 32
    assert again == first


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


def test_ignore_eos_generates_max_tokens(client):
    """A question the model answers and ends: with ignore_eos (llama-server's and vLLM's field, which
    serving benchmarks send) it goes on to max_tokens."""
    ask = dict(model=ALIAS, messages=[{"role": "user", "content": "Say hi."}], max_tokens=48, temperature=0)
    ended = client.chat.completions.create(**ask)
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens < 48
    full = client.chat.completions.create(**ask, extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 48
    assert full.choices[0].message.content.startswith(ended.choices[0].message.content)


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
    """4 slots and a queue of 4: once 8 requests are in, the next gets 503; closing the streams
    frees everything. On a slow machine a running request may reach max_tokens while the streams
    open, so requests are opened until one is refused, and the counts are checked against the
    requests that ended meanwhile."""
    body = {"model": ALIAS, "prompt": PROMPTS[4], "max_tokens": 200, "temperature": 0, "stream": True}
    before = server.wait_idle(timeout=60)            # no request of an earlier test still running
    ended = lambda m: sum(m[k] - before[k] for k in (              # noqa: E731
        "lite_requests_finished_total", "lite_requests_cancelled_total", "lite_requests_failed_total"))
    with contextlib.ExitStack() as held:
        streams = []
        for _ in range(16):
            r = held.enter_context(server.http.stream("POST", "/v1/completions", json=body))
            if r.status_code != 200:
                break
            streams.append(r)
        r.read()
        assert _err(r, 503)["code"] == "queue_full"
        assert len(streams) >= 8
        first = next(streams[0].iter_lines())                 # a running one has started
        assert first.startswith("data: ")
        # the scheduler admits waiting requests between steps: every accepted request is running,
        # waiting or has ended, and the slots stay full while 4 or more remain
        m = server.wait_metrics(lambda m: m["lite_slots_busy"] == min(4, len(streams) - ended(m)),
                                timeout=60)
        assert m["lite_slots_busy"] == min(4, len(streams) - ended(m))
        assert m["lite_slots_busy"] + m["lite_queue_length"] + ended(m) == len(streams)
    m = server.wait_idle(timeout=60)                          # every stream closed early
    assert m["lite_slots_busy"] == 0 and m["lite_queue_length"] == 0
    assert m["lite_kv_blocks_free"] == m["lite_kv_blocks_total"]
    assert ended(m) == len(streams) and m["lite_requests_failed_total"] == before["lite_requests_failed_total"]


def test_tokenize_and_detokenize(server, llm):
    ids = server.http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert ids == llm.tokenizer.encode("Hello world", add_special=False)
    assert server.http.post("/detokenize", json={"tokens": ids}).json()["content"] == "Hello world"


def test_log_has_the_start_and_a_line_per_request(server, client, llm):
    """The start-up line is INFO, and each request gets one access line: method, route, status,
    tokens (prompt+completion), ms."""
    u = complete(client, PROMPTS[6], n=2).usage
    server.http.get("/v1/no-route-for-the-log")
    assert u.prompt_tokens == len(llm.tokenize(PROMPTS[6]))
    for line in (rf"^lite: INFO: serving {ALIAS} on http://127\.0\.0\.1:{server.port} ",
                 rf"^lite: INFO: POST /v1/completions 200 {u.prompt_tokens}\+{u.completion_tokens} tokens [\d.]+ ms$",
                 r"^lite: INFO: GET /v1/no-route-for-the-log 404 [\d.]+ ms$"):
        out = server.wait_output(line)
        assert re.search(line, out, re.M), out


def test_metrics_count_tokens(server):
    m = server.metrics()
    assert m["lite_requests_total"] >= m["lite_requests_finished_total"] > 0
    assert m["lite_generated_tokens_total"] > 0 and m["lite_prompt_tokens_cached_total"] > 0
    assert m["lite_slots_total"] == 4


# --- the server under load ---

N_REQUESTS, N_CLIENTS, ROUNDS = 300, 32, 3
N_TOKENS = 3
LOAD_REGEX = " ?[a-z]{1,4}"
LOAD_PROMPTS = ["The capital of France is", "Once upon a time", "The sun is", "Water boils at",
                "My favourite food is", "1, 2, 3, 4,"]
MALFORMED = [b"{not json", json.dumps({"prompt": "x", "max_tokens": -1}).encode(),
             json.dumps({"prompt": 5}).encode(), json.dumps({"prompt": "x", "top_p": 3}).encode(),
             b'{"prompt": "x", "seed": -5}', b'{"prompt": "x", "temperature": NaN}',
             b'{"prompt": "x", "top_p": NaN}', b'{"prompt": "x", "repeat_penalty": Infinity}',
             b'{"prompt": "x", "model": ["smol"]}', b'{"prompt": "x", "model": {"id": "smol"}}']
TINY_TEMPERATURES = (1e-310, 1e-320)      # greedy: once they made the sampler's draw NaN


def _rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_many_clients_cancelled_and_malformed(device):
    if device == "cuda" and cuda_unavailable_reason():
        pytest.skip(f"needs a GPU: {cuda_unavailable_reason()}")
    model = real_model("smollm2")
    llm = LLM(model, device=device, max_context=128)
    alone = {p: llm.generate(p, max_tokens=N_TOKENS, temperature=0) for p in LOAD_PROMPTS}
    del llm
    srv = ServerProcess(model, "-np", "8", "-c", "128", "--max-queue", "64", "--max-body-mb", "1",
                        "--read-timeout", "10", "--max-connections", "64", device=device)
    try:
        srv.wait_ready()
        http = srv.http

        def one(i):
            prompt = LOAD_PROMPTS[i % len(LOAD_PROMPTS)]
            body = {"prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0}
            if i % 10 == 9:
                r = http.post("/v1/completions", content=MALFORMED[i // 10 % len(MALFORMED)],
                              headers={"content-type": "application/json"})
                return "malformed", r.status_code == 400 and "error" in r.json()
            if i % 10 == 4:                     # constrained by a grammar (cancelled one time in three)
                body["regex"] = LOAD_REGEX
                if i % 3 != 1:
                    r = http.post("/v1/completions", json=body)
                    return "constrained", r.status_code == 200 and bool(
                        re.fullmatch(LOAD_REGEX, r.json()["choices"][0]["text"]))
            if i % 3 == 1:                      # cancelled: read the first event, then hang up
                with http.stream("POST", "/v1/completions", json={**body, "max_tokens": 64,
                                                                  "stream": True}) as r:
                    first = next(r.iter_lines())
                return "cancelled", r.status_code == 200 and first.startswith("data: ")
            if i % 10 == 5:
                body["temperature"] = TINY_TEMPERATURES[i // 10 % 2]
            r = http.post("/v1/completions", json=body)
            return "ok", r.status_code == 200 and r.json()["choices"][0]["text"] == alone[prompt]

        per_round, rss, results = N_REQUESTS // ROUNDS, [], []
        with ThreadPoolExecutor(N_CLIENTS) as pool:
            for k in range(ROUNDS):
                results += pool.map(one, range(k * per_round, (k + 1) * per_round))
                srv.wait_idle(timeout=120)
                rss.append(_rss_kib(srv.proc.pid))
        assert len(results) == N_REQUESTS and srv.proc.poll() is None
        kinds = {kind: [ok for k, ok in results if k == kind]
                 for kind in ("ok", "cancelled", "malformed", "constrained")}
        assert all(all(v) for v in kinds.values()), {k: v.count(False) for k, v in kinds.items()}
        assert len(kinds["malformed"]) == N_REQUESTS // 10 and len(kinds["cancelled"]) >= N_REQUESTS // 4
        m = srv.wait_idle(timeout=60)
        assert m["lite_slots_busy"] == 0 and m["lite_queue_length"] == 0
        assert m["lite_kv_blocks_free"] == m["lite_kv_blocks_total"]
        assert m["lite_requests_finished_total"] >= len(kinds["ok"])
        assert rss[-1] - rss[0] < 32 * 1024, rss            # KiB: no growth past noise
    finally:
        srv.close()
