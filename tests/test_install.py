"""A CPU install on a fresh virtualenv: `pip install .` pulls no CUDA, NVIDIA or LLVM wheel, and
`lite run` works there. Needs the package index (skipped, with the reason, where pip cannot
reach it); bounded in time."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
