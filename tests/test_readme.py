"""The README's quick-start command, run exactly as written, answers with the default model."""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from realmodels import real_model

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
