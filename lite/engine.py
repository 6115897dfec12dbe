"""The engine: loads a model into stages, runs prefill in chunks and the decode loop.

It keeps the token ids whose KV is in the cache, so a request that starts with the same prefix
(a chat that grows turn by turn) reuses it instead of recomputing it (a one-entry prefix cache).
"""
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from lite.backends import resolve_backend
from lite.config import ModelConfig
from lite.errors import ContextOverflowError, LiteError
from lite.gguf_file import GGUFFile
from lite.kv_cache import KV_KINDS
from lite.stage import Stage, as_ids, split_layers
from lite.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_MAX_CONTEXT = 4096
DEFAULT_PREFILL_CHUNK = 512


@dataclass
class GenStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefill_s: float = 0.0
    generated: int = 0
    decode_s: float = 0.0
    stop_reason: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def prefill_tps(self):
        n = self.prompt_tokens - self.reused_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self):
        return self.generated / self.decode_s if self.decode_s > 0 else 0.0


class Engine:
    def __init__(self, model_path, device="auto", max_context=None, kv="f16",
                 prefill_chunk=None, layer_split=None):
        self.gguf = GGUFFile(model_path)
        self.cfg = ModelConfig.from_gguf(self.gguf.metadata, self.gguf.path)
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        if kv not in KV_KINDS:
            raise LiteError(f"--kv must be one of {', '.join(KV_KINDS)}, got {kv!r}")
        if max_context is None:
            max_context = min(DEFAULT_MAX_CONTEXT, self.cfg.context_length)
        if max_context < 1:
            raise LiteError(f"--max-context must be positive, got {max_context}")
        self.max_context = int(max_context)
        self.chunk = int(prefill_chunk or DEFAULT_PREFILL_CHUNK)
        if self.chunk < 1:
            raise LiteError(f"--prefill must be positive, got {self.chunk}")
        self.device, backend_cls = resolve_backend(device)
        self.stages = [Stage(self.gguf, self.cfg, spec, backend_cls, self.max_context, kv)
                       for spec in split_layers(self.cfg.n_layer, layer_split)]
        self.cached_ids = []   # token ids whose KV is in the cache, position 0 on

    # --- the forward -------------------------------------------------------------------------
    def _forward(self, ids, pos0, all_logits=False):
        x = as_ids(ids)
        for st in self.stages:
            x = st.forward(x, pos0, all_logits)
        return self.stages[-1].ops.to_host(x)

    def prefill(self, ids, all_logits=False):
        """Run the prompt through the model; returns logits of the last position (n_vocab,) or,
        with all_logits, of every new position. Reuses the cached prefix where it matches."""
        ids = list(ids)
        if not ids:
            raise LiteError("empty prompt: nothing to run")
        self.stages[0].kv.check_fits(len(ids))
        reuse = 0 if all_logits else _common_prefix(self.cached_ids, ids)
        reuse = min(reuse, len(ids) - 1)      # at least one position runs, to give logits
        self.cached_ids = ids[:reuse]
        outs = []
        for s in range(reuse, len(ids), self.chunk):
            chunk = ids[s:s + self.chunk]
            last = s + self.chunk >= len(ids)
            logits = self._forward(chunk, s, all_logits)
            if all_logits or last:
                outs.append(logits)
            self.cached_ids = ids[: s + len(chunk)]
        self.last_reuse = reuse
        return np.concatenate(outs) if all_logits else outs[-1][-1]

    def decode_step(self, token):
        pos = len(self.cached_ids)
        self.stages[0].kv.check_fits(pos + 1)
        logits = self._forward([token], pos)[-1]
        self.cached_ids.append(int(token))
        return logits

    def generate(self, ids, max_tokens, sampler, stats=None, stop_at_eog=True):
        """Yield generated token ids. The prompt plus max_tokens must fit the context."""
        ids = list(ids)
        total = len(ids) + max_tokens
        if total > self.max_context:
            raise ContextOverflowError(
                f"prompt of {len(ids)} tokens plus {max_tokens} to generate needs {total} "
                f"positions, more than the context of {self.max_context} "
                f"(raise -c/--max-context, or shorten the prompt or -n)")
        stats = stats if stats is not None else GenStats()
        stats.prompt_tokens = len(ids)
        t0 = time.perf_counter()
        logits = self.prefill(ids)
        stats.reused_tokens = self.last_reuse
        stats.prefill_s = time.perf_counter() - t0
        history = list(ids)
        t0 = time.perf_counter()
        stats.stop_reason = "length"
        for i in range(max_tokens):
            tok = sampler(logits, history)
            history.append(tok)
            if stop_at_eog and tok in self.tokenizer.eog_ids:
                stats.stop_reason = "eog"   # the end-of-generation token is not yielded
                break
            stats.generated = i + 1
            yield tok
            if i + 1 < max_tokens:
                logits = self.decode_step(tok)
        stats.decode_s = time.perf_counter() - t0


def _common_prefix(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
