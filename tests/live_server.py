"""A live `lite serve` for the tests: a subprocess on 127.0.0.1 at a free port, its output kept for
the tests to read, and its /metrics parsed. `prelude` runs Python in that process before the CLI
(a test that needs a fault inside the server injects it there)."""
import contextlib
import re
import socket
import subprocess
import sys
import tempfile
import time

try:                    # the openai client's HTTP library (renamed httpx2 in its newer releases)
    import httpx2 as httpx
except ImportError:
    import httpx

from lite.engine.scheduler import parse_prometheus

START_TIMEOUT_S = 180


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, model, *args, api_key=None, device="cpu", prelude=None):
        self.port, self.api_key = free_port(), api_key
        self.url = f"http://127.0.0.1:{self.port}"
        launch = (["-m", "lite.cli.main"] if prelude is None else
                  ["-c", prelude + "\nimport sys\nfrom lite.cli.main import main\nsys.exit(main(sys.argv[1:]))"])
        cmd = [sys.executable, *launch, "serve", model, "--device", device,
               "--port", str(self.port), *args] + (["--api-key", api_key] if api_key else [])
        self.log = tempfile.TemporaryFile("w+")       # stdout and stderr, read back on failure
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, headers=self.headers, timeout=120)

    def wait_ready(self):
        """Poll /health (503 while loading) until 200; bounded by START_TIMEOUT_S."""
        seen, deadline = set(), time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lite serve exited {self.proc.returncode}: {self.output()}")
            try:
                r = httpx.get(self.url + "/health", timeout=5)
                seen.add(r.status_code)
                if r.status_code == 200:
                    return seen
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"lite serve not ready in {START_TIMEOUT_S} s")

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def wait_output(self, pattern, timeout=30):
        """Poll the output until the regex matches a line (a request's log line follows its
        response); returns the output."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, out := self.output(), re.M) and time.monotonic() < deadline:
            time.sleep(0.1)
        return out

    def metrics(self):
        r = self.http.get("/metrics")
        r.raise_for_status()
        return parse_prometheus(r.text)

    def wait_metrics(self, ready, timeout=60):
        """Poll /metrics until ready(reading) holds or the timeout passes; returns the last reading."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if ready(m) or time.monotonic() > deadline:
                return m
            time.sleep(0.1)

    def wait_idle(self, timeout=60):
        """Poll /metrics until no slot is busy and nothing waits; returns the last reading."""
        return self.wait_metrics(lambda m: m["lite_slots_busy"] == 0 and m["lite_queue_length"] == 0,
                                 timeout)

    def close(self):
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@contextlib.contextmanager
def running(model, *args, **kw):
    """A ServerProcess that answers /health (the statuses it saw on the way in seen_status), closed
    on leaving: the body of the test files' module-scoped server fixtures."""
    srv = ServerProcess(model, *args, **kw)
    try:
        srv.seen_status = srv.wait_ready()
        yield srv
    finally:
        srv.close()
