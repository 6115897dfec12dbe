"""`lite bench serve` (lite/bench_serve.py): against a fake OpenAI server in this process (the requests
it gets, a llama-server-like stream with no usage, errors), and end to end on SmolLM2 on the CPU,
where it starts `lite serve` itself."""
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lite.bench_serve import Client, Result, bench_serve, format_table, summarize
from lite.errors import LiteError
from conftest import real_model


class FakeServer:
    """/v1/models (meta.n_vocab as llama-server reports it) and streamed /v1/completions of one
    text piece a token and no usage chunk; `status` other than 200 answers every completion so."""

    def __init__(self, n_vocab=50, status=200):
        self.bodies, self.status, outer = [], status, self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": "fake", "meta": {"n_vocab": n_vocab}}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                if outer.status != 200:
                    return self._send(outer.status, {"error": {"message": "prompt too long"}})
                self.send_response(200)
                self.end_headers()
                for i in range(body["max_tokens"]):
                    self.wfile.write(f"data: {json.dumps({'choices': [{'text': f't{i}'}]})}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    s = FakeServer()
    yield s
    s.close()


def test_requests_are_distinct_random_streams_and_counts_add_up(fake):
    rows = bench_serve(Client(fake.url), [1, 3], prompt_len=12, gen=5, requests=4, seed=1, warmup=True)
    assert [r["concurrency"] for r in rows] == [1, 3]
    for r in rows:
        assert r["requests"] == 4 and r["output_tokens"] == 4 * 5 and r["prompt_tokens"] == 4 * 12
        assert r["short_requests"] == 0 and r["model"] == "fake" and r["output_tok_s"] > 0
        assert r["tpot_median_ms"] is not None and r["itl_p99_ms"] is not None
    # warm-up: one request per in-flight slot, of at most 16 tokens; then the counted ones
    assert len(fake.bodies) == (1 + 4) + (3 + 4)
    prompts = [tuple(b["prompt"]) for b in fake.bodies]
    assert len(set(prompts)) == len(prompts)                        # no prefix shared by chance
    assert all(0 <= t < 50 for p in prompts for t in p)             # below the server's n_vocab
    b = fake.bodies[-1]
    assert (b["model"], b["temperature"], b["stream"], b["ignore_eos"], b["max_tokens"]) == (
        "fake", 0.0, True, True, 5)
    table = format_table(rows)
    assert "| concurrency |" in table.splitlines()[1] and len(table.splitlines()) == 2 + 2 + 1


def test_a_failing_server_is_one_line():
    s = FakeServer(status=400)
    try:
        with pytest.raises(LiteError, match=r"4 of 4 requests failed .* HTTP 400: prompt too long"):
            bench_serve(Client(s.url), [2], prompt_len=4, gen=2, requests=4, warmup=False)
    finally:
        s.close()
    with pytest.raises(LiteError, match="cannot reach"):
        Client(s.url).model()


def test_summary_of_known_times():
    # two requests: 4 tokens with first text at 100 ms and the last at 400 ms; one token only
    a = Result(ttft=0.1, latency=0.4, itl=[0.1, 0.1, 0.1], output_tokens=4, prompt_tokens=8)
    b = Result(ttft=0.3, latency=0.3, output_tokens=1, prompt_tokens=8)
    row = summarize([a, b], wall=2.0, concurrency=2, gen=4)
    assert row["output_tokens"] == 5 and row["output_tok_s"] == 2.5 and row["short_requests"] == 1
    assert row["ttft_median_ms"] == pytest.approx(200.0)
    assert row["tpot_median_ms"] == pytest.approx(100.0)           # (400 - 100) / 3, b has no TPOT
    assert row["itl_median_ms"] == pytest.approx(100.0)
    assert "1 request(s) ended before 4 tokens" in format_table([{**row, "server": "u", "model": None,
                                                                   "prompt_len": 8, "gen": 4}])


def lite(*args, timeout=600):
    p = subprocess.run([sys.executable, "-m", "lite.cli.main", *args], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def test_lite_bench_serve_starts_lite_serve_on_smollm2():
    pytest.importorskip("uvicorn")
    model = real_model("smollm2")
    rc, out, err = lite("bench", "serve", model, "-c", "1,2", "--prompt-len", "16", "--gen", "4",
                        "--requests", "2", "--json", "--device", "cpu", "--ctx-size", "64")
    assert rc == 0, err
    rows = json.loads(out)
    assert [r["concurrency"] for r in rows] == [1, 2]
    for r in rows:
        assert r["requests"] == 2 and r["prompt_tokens"] == 2 * 16 and r["output_tokens"] == 2 * 4
        assert r["output_tok_s"] > 0 and 0 < r["ttft_median_ms"] <= r["ttft_p99_ms"]


def test_bad_targets_are_one_line():
    rc, out, err = lite("bench", "serve", "http://127.0.0.1:9", "-c", "1", timeout=60)
    assert rc == 1 and out == "" and len(err.strip().splitlines()) == 1 and "cannot reach" in err
    rc, _, err = lite("bench", "serve", "http://127.0.0.1:9", "--device", "cpu", timeout=60)
    assert rc == 2 and "the target is a URL" in err and len(err.strip().splitlines()) == 1
    rc, _, err = lite("bench", "serve", "smollm2", "--port", "1", timeout=60)
    assert rc == 1 and "chooses lite serve's host and port" in err
