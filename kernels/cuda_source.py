"""CUDA C sources of the kernels: the .cu / .cuh files in kernels/cuda/, shipped as package data.

`source("matvec.cu")` is the text of one file with its local `#include "x.cuh"` lines replaced by
the included files' text (each file once, as `#pragma once` would), so that NVRTC (CuPy's
RawModule) and the host emulator of the tests (tests/cuda_c_emulator.py) compile the same complete
text without include paths. System headers (`#include <cuda_fp16.h>`) are left as they are.
"""
import functools
import re
from pathlib import Path

SOURCE_DIR = Path(__file__).parent / "cuda"
_INCLUDE = re.compile(r'^[ \t]*#include[ \t]+"([^"]+)"[ \t]*$', re.M)


@functools.lru_cache(maxsize=None)
def _read(name):
    path = SOURCE_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"no CUDA source {name} in {SOURCE_DIR}")
    return path.read_text()


def source(*names, defines=None):
    """The text of the named files in order, local includes inlined once; `defines` (a dict) as
    `#define KEY VALUE` lines before them."""
    seen = set()

    def expand(name):
        if name in seen:
            return ""
        seen.add(name)
        return _INCLUDE.sub(lambda m: expand(m.group(1)), _read(name))

    head = "".join(f"#define {k} {v}\n" for k, v in (defines or {}).items())
    return head + "".join(expand(n) for n in names)
