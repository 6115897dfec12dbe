"""Checks of a GGUF file's weights: every tensor finite after dequantization, the layers the
metadata promises present. `lite info --verify` runs them; the engine checks the layers on load.
NumPy only (no GPU libraries), so it runs anywhere."""
import hashlib
import os
import re
from dataclasses import dataclass

import numpy as np

from lite.errors import ConfigError

_LAYER = re.compile(r"^blk\.(\d+)\.")
_ROWS_PER_CHUNK_BYTES = 1 << 24     # dequantize about this many bytes at a time: bounded memory


def check_layers(gguf, n_layer):
    """Raise ConfigError naming the first layer below block_count with no tensors in the file."""
    present = {int(m.group(1)) for m in map(_LAYER.match, gguf.tensors) if m}
    for il in range(n_layer):
        if il not in present:
            raise ConfigError(f"{gguf.path}: block_count is {n_layer} but the file has no tensors "
                              f"for layer {il} (blk.{il}.*): the file is incomplete or its "
                              f"metadata is wrong")


@dataclass
class TensorCheck:
    name: str
    type_name: str
    n_nan: int = 0
    n_inf: int = 0
    error: str = ""

    @property
    def ok(self):
        return not (self.n_nan or self.n_inf or self.error)

    def describe(self):
        if self.error:
            return f"{self.name} ({self.type_name}): {self.error}"
        return f"{self.name} ({self.type_name}): {self.n_nan} NaN, {self.n_inf} inf values"


def check_tensor(t) -> TensorCheck:
    """Dequantize one tensor a band of rows at a time and count its NaN and inf values."""
    from gguf import quants as gguf_quants
    r = TensorCheck(t.name, t.type_name)
    row_elems = t.shape[-1]
    n_rows = t.n_elements // max(1, row_elems)
    row_bytes = t.nbytes // max(1, n_rows)
    if row_bytes * n_rows != t.nbytes:
        r.error = f"{t.nbytes} bytes do not hold {n_rows} rows of {row_elems} values"
        return r
    rows = t.raw.reshape(n_rows, row_bytes)
    step = max(1, _ROWS_PER_CHUNK_BYTES // max(1, row_bytes))
    try:
        for i in range(0, n_rows, step):
            w = gguf_quants.dequantize(rows[i:i + step], t.qtype)
            bad = ~np.isfinite(w)
            if bad.any():
                n_nan = int(np.isnan(w).sum())
                r.n_nan += n_nan
                r.n_inf += int(bad.sum()) - n_nan
    except Exception as e:   # a type the CPU cannot dequantize: reported, the rest still checked
        r.error = f"cannot dequantize: {e}"
    return r


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def known_file_digest(path):
    """(alias, expected sha256) when the file has the name of a model lite fetches, else None."""
    from lite.hub import KNOWN
    base = os.path.basename(path)
    for m in KNOWN.values():
        if m.filename == base and m.sha256:
            return m.alias, m.sha256
    return None
