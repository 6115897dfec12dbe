"""`lite bench serve URL|MODEL`: the serving benchmark, by vLLM's method (benchmark_serving.py).

Each request is a distinct prompt of random token ids (so no prefix cache serves any of it), sent as
a streamed /v1/completions at temperature 0 for a fixed number of generated tokens (ignore_eos, which
llama-server and vLLM honor); all requests of a concurrency level are queued at once and at most
`concurrency` are in flight. Per level: TTFT (time to the first text), TPOT (the rest of a
request's time over its other tokens), ITL (the gaps between streamed pieces), median and p99, and
output tokens per second over the level's wall time. Any OpenAI-compatible server works (lite serve,
llama-server); given a model instead of a URL, LiteServer starts `lite serve` on a free local port.

The client is the standard library's http.client on threads (one connection per request), so the
benchmark needs nothing the CPU install lacks.
"""
import http.client
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from lite.errors import LiteError

DEFAULT_VOCAB = 32000          # prompt ids are drawn below this (every served family has as many)
WARMUP_TOKENS = 16


@dataclass
class Result:
    """One request: its times in seconds, the tokens the server reported, or why it failed."""
    error: str | None = None
    ttft: float = 0.0
    latency: float = 0.0
    itl: list = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0


def _message(body):
    """The error message of an OpenAI-style error body, else the body's first line."""
    try:
        err = json.loads(body).get("error")
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return body.decode(errors="replace").strip().splitlines()[0][:200] if body.strip() else "(empty)"


class Client:
    """An OpenAI-compatible server at `url` (http or https; a trailing /v1 is the API's own)."""

    def __init__(self, url, api_key=None, timeout=600.0):
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise LiteError(f"{url!r} is not an http:// or https:// URL")
        self.url, self.timeout = url, timeout
        self.https = u.scheme == "https"
        self.host, self.port = u.hostname, u.port or (443 if self.https else 80)
        path = u.path.rstrip("/")
        self.base = path[:-3] if path.endswith("/v1") else path
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def _connection(self, timeout):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)

    def get(self, path, timeout=10.0):
        """(status, body) of GET path; OSError where nothing answers."""
        c = self._connection(timeout)
        try:
            c.request("GET", self.base + path, headers=self.headers)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def model(self):
        """(the served model's id or None, its vocabulary size or None) from /v1/models; a one-line
        error where the server cannot be reached or does not answer as an OpenAI server does."""
        try:
            status, body = self.get("/v1/models")
        except (OSError, http.client.HTTPException) as e:
            raise LiteError(f"cannot reach {self.url}: {e}") from None
        if status != 200:
            raise LiteError(f"{self.url}/v1/models answered {status}: {_message(body)}")
        try:
            m = (json.loads(body).get("data") or [{}])[0]
            return m.get("id"), (m.get("meta") or {}).get("n_vocab")
        except (ValueError, AttributeError, IndexError):
            raise LiteError(f"{self.url}/v1/models is not an OpenAI model list") from None

    def complete(self, payload):
        """One streamed completion, timed as it arrives."""
        t0 = time.perf_counter()
        res, last, chunks = Result(), None, 0
        c = self._connection(self.timeout)
        try:
            c.request("POST", self.base + "/v1/completions", body=json.dumps(payload), headers=self.headers)
            r = c.getresponse()
            if r.status != 200:
                return Result(error=f"HTTP {r.status}: {_message(r.read())}")
            for line in r:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                msg, now = json.loads(data), time.perf_counter()
                if msg.get("error"):
                    return Result(error=_message(data))
                usage = msg.get("usage")
                if usage:
                    res.output_tokens = usage.get("completion_tokens", 0)
                    res.prompt_tokens = usage.get("prompt_tokens", 0)
                choices = msg.get("choices") or [{}]
                if choices[0].get("text"):
                    if last is None:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                    last, chunks = now, chunks + 1
        except (OSError, http.client.HTTPException, ValueError) as e:
            return Result(error=f"{type(e).__name__}: {e}")
        finally:
            c.close()
        res.latency = time.perf_counter() - t0
        if last is None:
            res.ttft = res.latency
        res.output_tokens = res.output_tokens or chunks
        res.prompt_tokens = res.prompt_tokens or len(payload["prompt"])
        return res


def run_level(client, model, prompts, gen, concurrency):
    """All prompts queued at once, at most `concurrency` in flight -> (results, wall seconds)."""
    def payload(ids):
        p = {"prompt": ids, "max_tokens": gen, "temperature": 0.0, "stream": True,
             "stream_options": {"include_usage": True}, "ignore_eos": True}
        return p if model is None else {"model": model, **p}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(client.complete, [payload(p) for p in prompts]))
    return results, time.perf_counter() - t0


def summarize(results, wall, concurrency, gen):
    """One row of the table; a one-line error when a request failed."""
    failed = [r for r in results if r.error]
    if failed:
        raise LiteError(f"{len(failed)} of {len(results)} requests failed at concurrency "
                        f"{concurrency}, the first: {failed[0].error}")
    ms = 1e3
    ttft = [r.ttft * ms for r in results]
    tpot = [(r.latency - r.ttft) * ms / (r.output_tokens - 1) for r in results if r.output_tokens > 1]
    itl = [g * ms for r in results for g in r.itl]
    out = sum(r.output_tokens for r in results)
    row = {"concurrency": concurrency, "requests": len(results),
           "prompt_tokens": sum(r.prompt_tokens for r in results), "output_tokens": out,
           "short_requests": sum(r.output_tokens < gen for r in results),
           "duration_s": round(wall, 4), "output_tok_s": round(out / wall, 2),
           "requests_s": round(len(results) / wall, 3)}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        row[f"{name}_median_ms"] = round(float(np.median(xs)), 2) if xs else None
        row[f"{name}_p99_ms"] = round(float(np.percentile(xs, 99)), 2) if xs else None
    return row


def bench_serve(client, concurrency, prompt_len, gen, requests=None, vocab=None, seed=0, warmup=True,
                progress=None):
    """Rows for each concurrency level: `requests` (default 4 x the level, at least 8) distinct
    prompts of prompt_len random ids below `vocab` (default: DEFAULT_VOCAB, or the server's
    vocabulary where it reports a smaller one), each generating gen tokens."""
    model, n_vocab = client.model()
    v = vocab or min(DEFAULT_VOCAB, n_vocab or DEFAULT_VOCAB)
    rng = np.random.default_rng(seed)
    rows = []
    for c in concurrency:
        n = requests or max(8, 4 * c)
        if warmup:               # compiles and captures what this level needs, uncounted
            summarize(*run_level(client, model, rng.integers(0, v, (c, prompt_len)).tolist(),
                                 min(gen, WARMUP_TOKENS), c), c, 0)
        results, wall = run_level(client, model, rng.integers(0, v, (n, prompt_len)).tolist(), gen, c)
        rows.append({"server": client.url, "model": model, "prompt_len": prompt_len, "gen": gen,
                     **summarize(results, wall, c, gen)})
        if progress is not None:
            progress(rows[-1])
    return rows


def format_table(rows):
    cols = [("concurrency", "concurrency", "d"), ("requests", "requests", "d"),
            ("output_tokens", "output tokens", "d"), ("output_tok_s", "output tok/s", ".1f"),
            ("ttft_median_ms", "TTFT median ms", ".1f"), ("ttft_p99_ms", "TTFT p99 ms", ".1f"),
            ("tpot_median_ms", "TPOT median ms", ".2f"), ("tpot_p99_ms", "TPOT p99 ms", ".2f"),
            ("itl_median_ms", "ITL median ms", ".2f"), ("itl_p99_ms", "ITL p99 ms", ".2f")]
    head = "| " + " | ".join(title for _, title, _ in cols) + " |"
    out = [head, "|" + "|".join("-" * (len(t) + 1) + ":" for _, t, _ in cols) + "|"]
    for r in rows:
        cells = ["-" if r[k] is None else format(r[k], f) for k, _, f in cols]
        out.append("| " + " | ".join(c.rjust(len(t)) for c, (_, t, _) in zip(cells, cols)) + " |")
    if rows:
        r = rows[0]
        out.insert(0, f"{r['server']} ({r['model'] or 'model unnamed'}): distinct prompts of "
                      f"{r['prompt_len']} random token ids, {r['gen']} tokens generated each, "
                      f"temperature 0, streamed /v1/completions")
    short = sum(r["short_requests"] for r in rows)
    if short:
        out.append(f"{short} request(s) ended before {rows[0]['gen']} tokens: the server stopped at "
                   f"an end-of-generation token (it does not honor ignore_eos)")
    return "\n".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiteServer:
    """`lite serve MODEL ARGS...` as a subprocess on a free local port, from start until /health
    says ready (bounded by start_timeout) to a stop on leaving the `with`."""

    def __init__(self, model, args=(), start_timeout=600.0):
        if "--port" in args or "--host" in args:
            raise LiteError("lite bench serve chooses lite serve's host and port itself")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "lite.cli.main", "serve", model, "--host", "127.0.0.1",
                    "--port", str(self.port), *args]
        self.start_timeout, self.proc = start_timeout, None

    def __enter__(self):
        self.log = tempfile.TemporaryFile("w+")       # its output, read back if it fails
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self):
        client, deadline = Client(self.url), time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LiteError(f"lite serve exited ({self.proc.returncode}): {self.last_line()}")
            try:
                if client.get("/health", timeout=5)[0] == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.2)
        raise LiteError(f"lite serve was not ready in {self.start_timeout:.0f} s: {self.last_line()}")

    def last_line(self):
        self.log.seek(0)
        lines = [ln.strip() for ln in self.log.read().splitlines() if ln.strip()]
        return lines[-1] if lines else "(no output)"

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)          # uvicorn's graceful stop
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
