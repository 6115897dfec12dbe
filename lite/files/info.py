"""`lite info`: what is in a GGUF file, and (--verify) whether its weights are sound."""
import hashlib
import os
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from lite.files.config import ModelConfig
from lite.errors import ConfigError
from lite.files.gguf_file import GGUFFile


def describe(path, list_tensors=False) -> str:
    g = GGUFFile(path)
    md = g.metadata
    n_params = sum(t.n_elements for t in g.tensors.values())
    n_bytes = sum(t.nbytes for t in g.tensors.values())
    mix = Counter()
    for t in g.tensors.values():
        mix[t.type_name] += t.n_elements
    lines = [
        f"file:          {g.path} ({os.path.getsize(g.path) / 2**20:.1f} MiB, GGUF v{g.version})",
        f"name:          {md.get('general.name', '?')}",
        f"architecture:  {g.architecture or '?'}",
        f"parameters:    {n_params / 1e6:.1f} M ({n_bytes * 8 / max(n_params, 1):.2f} bits per weight)",
        "quant mix:     " + ", ".join(f"{k} {v / n_params:.1%}" for k, v in mix.most_common()),
    ]
    try:
        cfg = ModelConfig.from_gguf(md, g.path)
        lines += [
            f"context:       {cfg.context_length} tokens",
            f"layers:        {cfg.n_layer}, embedding {cfg.n_embd}, feed-forward {cfg.n_ff}",
            f"attention:     {cfg.n_head} heads, {cfg.n_head_kv} KV heads, head dim {cfg.head_dim}"
            + (f", sliding window {cfg.sliding_window}" if cfg.sliding_window else ""),
            f"vocabulary:    {cfg.n_vocab} ({md.get('tokenizer.ggml.model', '?')} tokenizer)",
        ]
        if cfg.is_hybrid:
            n_rec = sum(cfg.recurrent)
            lines.append(f"layer kinds:   {n_rec} Gated DeltaNet (recurrent), {cfg.n_layer - n_rec} full "
                         f"attention; delta rule {cfg.ssm_k_heads} key / {cfg.ssm_v_heads} value heads")
        if cfg.is_moe:
            lines.append(f"experts:       {cfg.n_expert}, {cfg.n_expert_used} used, ffn {cfg.n_ff_expert}"
                         + (f", shared expert ffn {cfg.n_ff_shexp}" if cfg.n_ff_shexp else ""))
    except ConfigError as e:
        lines.append(f"note:          lite cannot run this file: {e}")
    lines.append(f"chat template: {'yes' if 'tokenizer.chat_template' in md else 'no'}")
    if list_tensors:
        lines.append("")
        lines.append(f"{'name':40s} {'type':8s} shape")
        for t in g.tensors.values():
            lines.append(f"{t.name:40s} {t.type_name:8s} {' x '.join(map(str, t.shape))}")
    return "\n".join(lines)


def verify(path, progress=None):
    """Check every tensor (sizes, finite after dequantization), the layers block_count promises,
    and, for a file lite fetches, its sha256. Returns (summary lines, problem lines)."""
    g = GGUFFile(path)           # parsing already checks each tensor's size against the file
    problems = []
    try:
        check_layers(g, ModelConfig.from_gguf(g.metadata, g.path).n_layer)
    except ConfigError as e:
        problems.append(str(e))
    for t in g.tensors.values():
        r = check_tensor(t)
        if not r.ok:
            problems.append(r.describe())
        if progress is not None:
            progress.update(t.nbytes)
    lines = [f"verify:        {len(g.tensors)} tensors checked (sizes, finite after dequantization): "
             + (f"{len(problems)} problem(s)" if problems else "all good")]
    known = known_file_digest(g.path)
    if known is not None:
        alias, want = known
        got = file_sha256(g.path)
        if got == want:
            lines.append(f"sha256:        {got} (the published {alias} file)")
        else:
            problems.append(f"sha256 {got} differs from the published {alias} file's {want}")
    return lines, problems


# --- checks of the weights ----------------------------------------------------------------------
# Checks of a GGUF file's weights: every tensor finite after dequantization, the layers the
# metadata promises present. `lite info --verify` runs them; the engine checks the layers on load.
# NumPy only (no GPU libraries), so it runs anywhere.
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
    from lite.files.hub import KNOWN
    base = os.path.basename(path)
    for m in KNOWN.values():
        if m.filename == base and m.sha256:
            return m.alias, m.sha256
    return None
