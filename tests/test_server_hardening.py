"""`lite serve` against what a careless or hostile client sends, live (a subprocess, SmolLM2 on the
CPU, tiny outputs): sampling edge values answer, every malformed field gets a 400 naming it and
the keep-alive connection goes on, slow and idle sockets are closed, big bodies are refused unread,
the open connections are capped, the API key's scheme is case-insensitive, a busy port is one
line, the log can be JSON; and a request whose sampling fails, or a scheduler thread that dies,
answers 500 in OpenAI's JSON, the first leaving the server up, the second ending it with exit 1."""
import asyncio
import json
import re
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from conftest import real_model  # noqa: E402
from lite.engine.sampling import Sampler, SamplingParams  # noqa: E402
from live_server import ServerProcess, free_port, httpx, running  # noqa: E402
from lite.files.synth import synth  # noqa: E402

KEY = "hardening-key"
READ_TIMEOUT_S = 1
MAX_BODY = 64 * 1024                # --max-body-mb 0.0625
MAX_CONNECTIONS = 8
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(real_model("smollm2"), "-np", "2", "-c", "128", "--read-timeout",
                        str(READ_TIMEOUT_S), "--max-body-mb", str(MAX_BODY / 2 ** 20),
                        "--max-connections", str(MAX_CONNECTIONS), "--log-format", "json", api_key=KEY)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.close()


def post(http, path, raw):
    return http.post(path, content=raw if isinstance(raw, bytes) else raw.encode(),
                     headers={"content-type": "application/json"})


def test_tiny_temperature_is_greedy():
    logits = np.random.default_rng(3).standard_normal(500).astype(np.float32)
    for t in (1e-310, 1e-320, 1e-6):
        assert Sampler(SamplingParams(temperature=t, seed=1))(logits) == int(np.argmax(logits))


def test_tiny_temperatures_answer_greedy_and_the_server_goes_on(server):
    body = '{"prompt": "%s", "max_tokens": 1, "temperature": %s}'
    greedy = post(server.http, "/v1/completions", body % (PROMPT, "0")).json()["choices"][0]["text"]
    for t in ("1e-310", "1e-320"):
        r = post(server.http, "/v1/completions", body % (PROMPT, t))
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy, r.text
    r = post(server.http, "/v1/completions", body % ("Once upon a time", "0.7"))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


# (route, the body's fields as JSON text, the param the 400 names); JSON text because NaN and
# Infinity are not JSON but Python's parser (and so clients built on it) send them
MALFORMED = [(field, value, field) for field, values in {
    "seed": ["-5", "-2", "18446744073709551616", "1.5", '"7"'],
    "temperature": ["NaN", "Infinity", "-Infinity", "1e999", "-0.1", "2.5", '"hot"', "true"],
    "top_p": ["NaN", "0", "1.5", "[0.5]"],
    "top_k": ["-1", "1.5", "NaN"],
    "min_p": ["NaN", "-0.5", "2"],
    "repeat_penalty": ["Infinity", "0", "-1", "NaN"],
    "max_tokens": ["0", "-1", "NaN", "2.5", "true"],
    "max_completion_tokens": ["0", "Infinity"],
    "n": ["2", "NaN"],
    "frequency_penalty": ["NaN", "3"],
    "presence_penalty": ["-Infinity"],
    "model": ['["smollm2"]', '{"id": "smollm2"}', "5"],
    "stream": ['"yes"', "1"],
    "stream_options": ["[]", "5"],
    "stop": ["5", "[1]", '["x", null]', json.dumps(["s"] * 17), json.dumps("x" * 1025)],
    "user": ["5"],
    "prompt": ["5", "[]", "[1.5]", "[-1]", "[1000000000]", "[true]", "null"],
}.items() for value in values]


def test_every_malformed_value_is_a_400_naming_it_and_the_connection_goes_on(server):
    http = server.http                  # one keep-alive client: each 400 is followed by a request
    for field, value, param in MALFORMED:
        fields = {"prompt": '"x"', "max_tokens": "1", field: value}
        raw = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
        r = post(http, "/v1/completions", raw)
        assert r.status_code == 400, (raw, r.status_code, r.text)
        assert r.json()["error"]["param"] == param, (raw, r.text)
        assert http.get("/v1/models").status_code == 200, raw
    chat = [('{"messages": "hello"}', "messages"), ('{"messages": [{"role": 5}]}', "messages"),
            ('{"messages": [{"role": "user", "content": 5}]}', "messages"),
            ('{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "temperature"),
            ('{"messages": [{"role": "user", "content": "x"}], "model": ["a"]}', "model")]
    for raw, param in chat:
        r = post(http, "/v1/chat/completions", raw)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (raw, r.text)
        assert http.get("/v1/models").status_code == 200, raw
    for raw, param in [('{"content": "x", "add_special": "yes"}', "add_special"),
                       ('{"content": 5}', "content")]:
        r = post(http, "/tokenize", raw)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (raw, r.text)
    r = post(http, "/v1/completions", '{"prompt": "x", "max_tokens": 1, "seed": 18446744073709551615}')
    assert r.status_code == 200, r.text         # the largest seed is a seed


def raw_socket(server):
    s = socket.create_connection(("127.0.0.1", server.port))
    s.settimeout(15)                    # well past READ_TIMEOUT_S: a recv that returns was answered
    return s


def read_all(s):
    """What the server sent until it closed (a reset after an answer, when it closed on a body it
    did not read, ends it too)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def head(path, extra=b""):
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\n").encode() + extra


def error_of(reply):
    status = int(reply.split(b" ", 2)[1])
    return status, json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]


def test_idle_and_half_sent_sockets_are_closed(server):
    with raw_socket(server) as idle, raw_socket(server) as half:
        half.sendall(head("/v1/completions"))           # the head never ends
        assert read_all(idle) == b"" and read_all(half) == b""


def test_a_body_that_stalls_gets_408(server):
    with raw_socket(server) as s:
        s.sendall(head("/v1/completions", b"Content-Length: 100\r\n\r\n{\"prompt\""))
        status, err = error_of(read_all(s))
    assert status == 408 and err["code"] == "timeout"


def test_a_body_over_the_limit_gets_413_unread(server):
    # declared: refused before a byte of the body is sent
    with raw_socket(server) as s:
        s.sendall(head("/v1/completions", f"Content-Length: {100 * MAX_BODY}\r\n\r\n".encode()))
        status, err = error_of(read_all(s))
    assert status == 413 and err["code"] == "body_too_large"
    # chunked: refused once the count passes the limit, though the body has not ended
    with raw_socket(server) as s:
        s.sendall(head("/v1/completions", b"Transfer-Encoding: chunked\r\n\r\n"))
        piece = b"a" * 4096
        for _ in range(MAX_BODY // len(piece) + 1):
            s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        status, err = error_of(read_all(s))
    assert status == 413 and err["code"] == "body_too_large"
    # through a client: the 413, then the same client goes on
    r = post(server.http, "/v1/completions", '{"prompt": "%s"}' % ("word " * MAX_BODY))
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert server.http.get("/v1/models").status_code == 200


def test_connections_past_the_limit_get_503(server):
    sockets = [raw_socket(server) for _ in range(MAX_CONNECTIONS)]
    try:
        with raw_socket(server) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                      + b"\r\n\r\n")
            status, err = error_of(read_all(s))
        assert status == 503 and err["code"] == "too_many_connections"
    finally:
        for s in sockets:
            s.close()
    assert server.http.get("/v1/models").status_code == 200


def test_bearer_in_any_case(server):
    def models(auth):
        return httpx.get(server.url + "/v1/models", headers={"Authorization": auth}).status_code
    assert [models(f"{scheme} {KEY}") for scheme in ("Bearer", "bearer", "BEARER")] == [200] * 3
    assert [models(a) for a in (f"Basic {KEY}", "Bearer wrong", KEY, "")] == [401] * 4


def test_json_log_lines(server):
    r = post(server.http, "/v1/completions", '{"prompt": "%s", "max_tokens": 1}' % PROMPT)
    usage, rid = r.json()["usage"], r.headers["x-request-id"]
    out = server.wait_output(rf'"request_id": "{rid}"')
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    start = [x for x in lines if x["message"].startswith("serving ")]
    assert len(start) == 1 and start[0]["level"] == "info"
    mine = [x for x in lines if x.get("request_id") == rid]
    assert len(mine) == 1, out
    assert {k: mine[0][k] for k in ("method", "route", "status", "prompt_tokens", "completion_tokens")} == {
        "method": "POST", "route": "/v1/completions", "status": 200,
        "prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"]}
    assert mine[0]["ms"] >= 0


def test_busy_port_is_one_line_and_exit_1():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "lite.cli.main", "serve", "--port", str(port)],
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr == f"lite: error: port {port} is in use\n", p.stderr


def asgi(app, *requests):
    """The responses of an ASGI app to (method, path, json) requests, in process."""
    async def ask():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
            return [await c.request(m, path, json=body) for m, path, body in requests]
    return asyncio.run(ask())


def test_a_dead_scheduler_says_503():
    from lite.server.app import ServerState, create_app
    state = ServerState("m", scheduler=SimpleNamespace(failure=RuntimeError("gone")))
    health, completion = asgi(create_app(state), ("GET", "/health", None),
                              ("POST", "/v1/completions", {"prompt": "x"}))
    assert health.status_code == 503 and health.json()["status"] == "error"
    assert completion.status_code == 503 and completion.json()["error"]["code"] == "scheduler_stopped"


def test_an_exception_anywhere_is_a_json_500_with_the_request_id():
    from lite.server.app import ServerState, create_app
    from lite.server.limits import Guard

    def encode(*args):
        raise RuntimeError("tokenizer bug")
    state = ServerState("m", scheduler=SimpleNamespace(failure=None, tokenizer=SimpleNamespace(encode=encode)))

    async def broken(scope, receive, send):
        raise RuntimeError("app bug")
    for app in (create_app(state), broken):
        r, = asgi(Guard(app, max_body=1000, read_timeout=5), ("POST", "/v1/completions", {"prompt": "x"}))
        err = r.json()["error"]
        assert r.status_code == 500 and err["type"] == "server_error" and "bug" in err["message"]
        assert err["request_id"] == r.headers["x-request-id"]


# In the server's process: sampling fails for seed 13 (an error of that request), and the
# scheduler's loop itself fails once a request with seed 66 is running (a bug in the loop).
FAULTS = """
from lite.engine import sampling
from lite.engine import scheduler
draw, plan = sampling.Sampler.__call__, scheduler.Scheduler._plan
def failing_draw(self, logits, history=()):
    if self.p.seed == 13:
        raise RuntimeError("injected sampling failure")
    return draw(self, logits, history)
def failing_plan(self):
    if any(s.params.sampling.seed == 66 for s in self.running):
        raise RuntimeError("injected scheduler failure")
    return plan(self)
sampling.Sampler.__call__, scheduler.Scheduler._plan = failing_draw, failing_plan
"""


def test_failures_inside_the_scheduler_answer_500():
    srv = ServerProcess(real_model("smollm2"), "-np", "2", "-c", "128", prelude=FAULTS)
    try:
        srv.wait_ready()
        body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0.5}
        r = srv.http.post("/v1/completions", json={**body, "seed": 13})
        err = r.json()["error"]
        assert r.status_code == 500 and err["type"] == "server_error"
        assert err["request_id"] == r.headers["x-request-id"] and "injected sampling" in err["message"]
        with srv.http.stream("POST", "/v1/completions", json={**body, "seed": 13, "stream": True}) as r:
            events = [line for line in r.iter_lines() if line]
        assert "injected sampling" in json.loads(events[-2][len("data: "):])["error"]["message"]
        assert srv.http.post("/v1/completions", json={**body, "seed": 1}).status_code == 200
        r = srv.http.post("/v1/completions", json={**body, "seed": 66})
        assert r.status_code == 500 and "injected scheduler" in r.json()["error"]["message"]
        assert srv.proc.wait(60) == 1
        assert re.search(r"^lite: error: the scheduler stopped: RuntimeError: injected scheduler failure$",
                         srv.output(), re.M), srv.output()
    finally:
        srv.close()


WITHOUT_TEMPLATE = """from lite.files.tokenizer import Tokenizer
real = Tokenizer.from_metadata.__func__
Tokenizer.from_metadata = classmethod(
    lambda cls, md: real(cls, {k: v for k, v in md.items() if k != "tokenizer.chat_template"}))"""


def test_chat_on_a_model_without_a_template_warns_once(tmp_path):
    """A base model (its file read without its chat template) still answers chat, and the log says
    once that the template is a built-in one."""
    model = tmp_path / "tiny.gguf"
    synth("llama", "tiny", "Q8_0", model)
    with running(str(model), "-c", "64", prelude=WITHOUT_TEMPLATE) as srv:
        for _ in range(2):
            r = srv.http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert r.status_code == 200, r.text
        out = srv.wait_output(r"POST /v1/chat/completions 200 .*\n(.|\n)*POST /v1/chat/completions 200")
    assert out.count("has no chat template") == 1, out
