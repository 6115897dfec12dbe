"""CUDA C sources of the kernels: the .cu / .cuh files in kernels/cuda/, shipped as package data.

`source("copy16.cu")` is the text of one file with its local `#include "x.cuh"` lines replaced by
the included files' text (each file once, as `#pragma once` would), so that NVRTC (CuPy's
RawModule) and the host emulator of the tests (tests/cuda_c_emulator.py) compile the same complete
text without include paths. System headers (`#include <cuda_fp16.h>`) are left as they are.
`includes("a.cuh", "b.cuh")` is the text a .cu file of just those `#include` lines would be: how a
module made only of headers is named in Python instead of in a file of include lines.

The table headers (iq3_grid.cuh, iq3_sign_masks.cuh, iq4_values.cuh, iq3_offset_tables.cuh,
iq3_signed_grid_words.cuh) have no file: they are gguf-py's tables written as C arrays by
kernels/iq_tables.py (C_TABLE_HEADERS) when first read. They are generated data, not hand-written
CUDA C, which lives in the files of kernels/cuda/ only.
"""
import functools
import re
from pathlib import Path

SOURCE_DIR = Path(__file__).parent / "cuda"
_INCLUDE = re.compile(r'^[ \t]*#include[ \t]+"([^"]+)"[ \t]*$', re.M)


@functools.lru_cache(maxsize=None)
def _read(name):
    from lite.kernels.iq_tables import C_TABLE_HEADERS     # (numpy and gguf-py: only when read)
    if name in C_TABLE_HEADERS:
        return C_TABLE_HEADERS[name]()
    path = SOURCE_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"no CUDA source {name} in {SOURCE_DIR}")
    return path.read_text()


def _expander():
    """expand(name): the file's text with its local includes inlined, "" if this expander gave it before."""
    seen = set()

    def expand(name):
        if name in seen:
            return ""
        seen.add(name)
        return _INCLUDE.sub(lambda m: expand(m.group(1)), _read(name))
    return expand


def _defines(defines):
    return "".join(f"#define {k} {v}\n" for k, v in (defines or {}).items())


def source(*names, defines=None):
    """The text of the named files in order, local includes inlined once; `defines` (a dict) as
    `#define KEY VALUE` lines before them."""
    expand = _expander()
    return _defines(defines) + "".join(expand(n) for n in names)


def includes(*names, defines=None):
    """The text of a .cu file made of one `#include "name"` line for each of names, in order: each
    file's text (local includes inlined once) followed by the newline that ended its line."""
    expand = _expander()
    return _defines(defines) + "".join(expand(n) + "\n" for n in names)


def current_device(cp):
    """The current device's id, for caching what is compiled per device (modules, function
    attributes); -1 where cp has no device API (the tests' host emulation of cupy)."""
    try:
        return cp.cuda.Device().id
    except AttributeError:
        return -1
