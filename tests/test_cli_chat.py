"""The command line's chat and its settings: Ctrl-C stops an answer and the chat goes on (a second
Ctrl-C, at the prompt, ends it); -c above the model's trained context and chat with a model that has
no chat template each warn in one line (errors with --strict); the CPU backend's default threads
are the physical cores the process may use, and `lite bench -t` sets them. A tiny synthetic model
(greedy answers that run to the end of the context) keeps these fast."""
import signal
import subprocess
import sys
import threading
import time

import pytest

from lite.backends.cpu import physical_cores
from lite.cli import generate
from lite.engine.engine import GenStats
from lite.files.gguf_file import GGUFFile
from lite.files.tokenizer import Tokenizer
from test_cli import lite
from test_cli_flags import cli, tiny  # noqa: F401  (tiny: the synthetic model fixture)

TIMEOUT = 300


def warnings(err):
    return [ln for ln in err.splitlines() if "WARNING" in ln]


# ---- -c above the trained context ----

def test_context_above_the_trained_one_warns_once_or_fails_with_strict(tiny):
    trained = next(v for k, v in GGUFFile(tiny).metadata.items() if k.endswith(".context_length"))
    common = ["run", "-m", tiny, "--device", "cpu", "--temp", "0", "-n", "2", "--no-chat", "-p", "hi"]
    rc, out, err = lite(*common, "-c", str(trained))
    assert rc == 0 and warnings(err) == [], err
    rc, out, err = lite(*common, "-c", str(2 * trained))
    assert rc == 0 and out.startswith("hi"), err
    assert len(warnings(err)) == 1 and f"-c {2 * trained}" in err and str(trained) in err
    rc, out, err = lite(*common, "-c", str(2 * trained), "--strict")
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"lite: error: -c {2 * trained}") and "--strict" in lines[0]


# ---- a model without a chat template ----

@pytest.fixture
def no_template(monkeypatch):
    """Every model loaded is read as if its file carried no chat template (a base model)."""
    real = Tokenizer.from_metadata.__func__

    def without(cls, md):
        return real(cls, {k: v for k, v in md.items() if k != "tokenizer.chat_template"})
    monkeypatch.setattr(Tokenizer, "from_metadata", classmethod(without))


def test_chat_without_a_template_warns_once(capsys, caplog, tiny, no_template, monkeypatch):
    common = ["-m", tiny, "--device", "cpu", "--temp", "0", "-n", "3"]

    def warned():
        found = [r for r in caplog.records if r.levelname == "WARNING"]
        caplog.clear()
        return found
    monkeypatch.setattr(sys, "stdin", _Lines(["first\n", "second\n"]))
    rc, out, err = cli(capsys, "chat", *common)
    assert rc == 0 and len(out.strip().splitlines()) == 2, err
    found = warned()
    assert len(found) == 1 and "no chat template" in found[0].getMessage()
    assert "\n" not in found[0].getMessage()
    rc, out, err = cli(capsys, "run", *common, "--chat", "-p", "hi")
    assert rc == 0 and len(warned()) == 1
    rc, out, err = cli(capsys, "run", *common, "-p", "hi")     # completion: nothing to warn about
    assert rc == 0 and warned() == [] and out.startswith("hi")
    rc, out, err = cli(capsys, "run", *common, "--chat", "--strict", "-p", "hi")
    assert rc == 1 and out == "" and err.startswith("lite: error: ") and "no chat template" in err
    assert len(err.splitlines()) == 1


# ---- Ctrl-C ----

class _Lines:
    """Standard input as a list of lines; KeyboardInterrupt where a line is that exception."""

    def __init__(self, lines):
        self.lines = list(lines)

    def isatty(self):
        return False

    def readline(self):
        line = self.lines.pop(0) if self.lines else ""
        if isinstance(line, BaseException):
            raise line
        return line


class _Out:
    def __init__(self):
        self.text = ""

    def write(self, text, flush=True):
        self.text += text


class _Talker:
    """An LLM stand-in whose answers are endless; a SIGINT arrives at its third piece."""

    def __init__(self):
        self.closed, self.prompts = 0, []
        self.last_stats = GenStats()

    def chat_ids(self, msgs):
        self.prompts.append([dict(m) for m in msgs])
        return [0]

    def stream(self, ids, **kw):
        try:
            for k in range(1000):
                if k == 2 and len(self.prompts) == 1:
                    signal.raise_signal(signal.SIGINT)
                yield f"w{k} "
        finally:
            self.closed += 1


def test_ctrl_c_stops_the_answer_and_the_chat_goes_on(monkeypatch):
    llm, out, msgs = _Talker(), _Out(), []
    monkeypatch.setattr(sys, "stdin", _Lines(["second\n", KeyboardInterrupt()]))
    with pytest.raises(KeyboardInterrupt):       # the second Ctrl-C, at the prompt
        generate.chat_loop(llm, out, msgs, 1000, {}, (), first="first")
    first, second = out.text.split("\n")[:2]
    assert first == "w0 w1 w2 "                  # stopped at the piece the signal came with
    assert len(second.split()) == 1000           # the next message is answered in full
    assert llm.closed == 2
    assert llm.prompts[1][1] == {"role": "assistant", "content": "w0 w1 w2 "}
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_in_a_live_chat(tiny):
    """`lite chat` as a process: SIGINT while the answer streams stops it, the next message is
    answered; SIGINT at the prompt then ends the session with status 130."""
    p = subprocess.Popen([sys.executable, "-m", "lite.cli.main", "-v", "chat", "-m", tiny, "--device",
                          "cpu", "--temp", "0", "-n", "-1"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    got = {"out": "", "err": ""}
    readers = [threading.Thread(target=_drain, args=(s, got, k), daemon=True)
               for s, k in ((p.stdout, "out"), (p.stderr, "err"))]
    for r in readers:
        r.start()
    try:
        p.stdin.write("hi\n")
        p.stdin.flush()
        _wait(lambda: len(got["out"]) > 20)
        p.send_signal(signal.SIGINT)
        _wait(lambda: "answer stopped" in got["err"])
        p.stdin.write("again\n")
        p.stdin.flush()
        _wait(lambda: got["err"].count("turn:") == 1 and len(got["out"].split("\n", 1)[-1]) > 20)
        p.send_signal(signal.SIGINT)                 # stops the second answer
        _wait(lambda: got["err"].count("answer stopped") == 2 and got["err"].count("turn:") == 2)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)                 # at the prompt: the end
        assert p.wait(TIMEOUT) == 130
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    for r in readers:
        r.join(10)
    assert "Traceback" not in got["err"] and got["err"].rstrip().endswith("lite: interrupted")


def _drain(stream, got, key):
    for chunk in iter(lambda: stream.read(1), ""):
        got[key] += chunk


def _wait(cond, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# ---- CPU threads ----

def test_physical_cores_count_smt_siblings_once():
    smt = {c: f"{c % 4},{c % 4 + 4}" for c in range(8)}     # 4 cores, 2 threads each
    assert physical_cores(range(8), smt.__getitem__) == 4
    assert physical_cores({0, 4}, smt.__getitem__) == 1         # both threads of one core
    assert physical_cores({0, 1, 5}, smt.__getitem__) == 2
    assert physical_cores(range(3), lambda c: "0-1" if c < 2 else "2") == 2
    assert physical_cores({3, 7}, lambda c: open("/nonexistent/siblings").read()) == 2


def test_default_threads_are_the_physical_cores_and_bench_takes_t(capsys, tiny):
    code = ("import sys; from lite import LLM; from threadpoolctl import threadpool_info; "
            "LLM(sys.argv[1], device='cpu'); "
            "print(sorted({p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas'}))")
    r = subprocess.run([sys.executable, "-c", code, tiny], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str([physical_cores()])
    from threadpoolctl import threadpool_info
    rc, out, err = cli(capsys, "bench", tiny, "--device", "cpu", "-p", "8", "-n", "2", "-r", "1", "-t", "1")
    assert rc == 0, err
    assert {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"} == {1}
    rc, out, err = cli(capsys, "bench", tiny, "-t", "0")
    assert rc == 1 and "'-t' / '--threads'" in err and len(err.splitlines()) == 1
