"""The engine: loads a model into stages, runs prefill in chunks and the decode loop.

It keeps the token ids whose KV is in the cache, so a request that starts with the same prefix
(a chat that grows turn by turn) reuses it instead of recomputing it (a one-entry prefix cache).
"""
import functools
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from lite.backend_config import BackendConfig
from lite.backends import resolve_backend
from lite.chain.chunking import CostProfile, choose_schedule
from lite.files.config import ModelConfig
from lite.engine.devices import assign_devices, parse_devices, resolve_handoff
from lite.errors import ContextOverflowError, DeviceError, LiteError, NonFiniteLogitsError
from lite.files.gguf_file import GGUFFile
from lite.engine.kv_cache import KV_KINDS
from lite.chain.pipeline import ChunkJob, StageChain, StageError
from lite.engine.stage import Stage, as_ids, split_layers
from lite.files.tokenizer import Tokenizer
from lite.files.info import check_layers

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
                 prefill_chunk=None, layer_split=None, pipeline="chain", handoff_depth=1,
                 devices=None, handoff="host", handoff_stream=False, device_times=False,
                 experts="auto", expert_cache="auto", config=None, contiguous_kv=True, strict=False):
        self.config = config if config is not None else BackendConfig()
        self.gguf = GGUFFile(model_path)
        self.cfg = ModelConfig.from_gguf(self.gguf.metadata, self.gguf.path)
        check_layers(self.gguf, self.cfg.n_layer)
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        if kv not in KV_KINDS:
            raise LiteError(f"--kv must be one of {', '.join(KV_KINDS)}, got {kv!r}")
        if max_context is None:
            max_context = min(DEFAULT_MAX_CONTEXT, self.cfg.context_length)
        if max_context < 1:
            raise LiteError(f"--max-context must be positive, got {max_context}")
        self.max_context = int(max_context)
        if self.max_context > self.cfg.context_length:   # past the positions it was trained on
            msg = (f"-c {self.max_context} is above the {self.cfg.context_length} positions this "
                   f"model was trained on: answers past them are not to be trusted")
            if strict:
                raise LiteError(msg + " (--strict)")
            log.warning(msg)
        self.chunk = prefill_chunk or DEFAULT_PREFILL_CHUNK     # tokens, or "auto"
        if self.chunk != "auto" and int(self.chunk) < 1:
            raise LiteError(f"--prefill must be auto or a positive token count, got {self.chunk}")
        self.device, backend_cls = resolve_backend(device)
        if self.device == "cuda" and kv == "f32":     # the GPU's decode kernels read f16 or int8 caches
            raise LiteError("--kv f32 runs on the CPU only (--device cpu); on the GPU use f16 or int8")
        devices = parse_devices(devices)
        if devices and self.device != "cuda":
            raise LiteError("--devices places stages on GPUs: it needs a usable GPU (--device cuda)")
        if devices and layer_split in (None, "auto"):
            layer_split = len(devices)                     # one stage per listed GPU
        specs = split_layers(self.cfg.n_layer, layer_split)
        if self.device == "cuda":
            import cupy
            stage_devs = assign_devices(len(specs), devices, cupy.cuda.runtime.getDeviceCount())
            can_peer = lambda a, b: bool(cupy.cuda.runtime.deviceCanAccessPeer(a, b))  # noqa: E731
        else:
            stage_devs, can_peer = [None] * len(specs), None
        self.handoff = resolve_handoff(handoff, stage_devs, self.device, can_peer, handoff_stream)
        from lite.backends.experts import MODES, parse_cache
        if experts not in MODES:
            raise LiteError(f"--experts must be one of {', '.join(MODES)}, got {experts!r}")
        try:
            parse_cache(expert_cache)
        except ValueError as e:
            raise LiteError(str(e)) from None
        self.stages = [Stage(self.gguf, self.cfg, spec, backend_cls, self.max_context, kv, dev,
                             experts=experts, expert_cache=expert_cache, handoff=self.handoff,
                             handoff_stream=handoff_stream, config=self.config,
                             contiguous_kv=contiguous_kv)
                       for spec, dev in zip(specs, stage_devs)]
        # Device time per stage-chunk (CUDA events) only when a timeline is asked for.
        self.chain = StageChain(self.stages, mode=pipeline, handoff_depth=handoff_depth,
                                device_times=device_times)
        self.profile = None
        self.cached_ids = []   # token ids whose KV is in the cache, position 0 on
        self.n_requests = 0
        self.kv_kind = kv

    def expert_stats(self):
        """The expert caches' counters summed over stages (experts off the GPU), else None."""
        got = [g for g in (st.ops.expert_stats() for st in self.stages) if g]
        if not got:
            return None
        tot = {k: (sum(g[k] for g in got) if isinstance(v, (int, float)) else v) for k, v in got[0].items()}
        n = tot["hits"] + tot["misses"]
        tot["hit_rate"] = round(tot["hits"] / n, 4) if n else 0.0
        return tot

    @functools.cached_property
    def model_key(self):
        """The model shape and its tensor types: what the cost profile's constants depend on (the
        file's, so made once: --prefill auto asks at every prompt)."""
        c = self.cfg
        types = "+".join(sorted({t.qtype.name for t in self.gguf.tensors.values()}))
        moe = f"-e{c.n_expert}x{c.n_expert_used}" if c.is_moe else ""
        return (f"{c.arch}-L{c.n_layer}-d{c.n_embd}-ff{c.n_ff or c.n_ff_expert}{moe}"
                f"-{len(self.gguf.tensors)}t-{types}")

    def chunk_for(self, n_tokens, start=0):
        """The prefill chunk: fixed, or chosen by the cost model from the prompt, the stage layout
        and the profile: a size, or a schedule of sizes (a tuple) when uneven chunks win."""
        if self.chunk != "auto":
            return int(self.chunk)
        from lite.chain.calibrate import profile_key
        key = profile_key(self)
        if self.profile is None or self.profile.key != key:   # placement, cache, split changed
            self.profile = self.cost_profile(start)
        # Stages overlap only across devices: virtual stages on one device run one after another,
        # so the pipeline term counts devices, and each device pays its stages' per-stage costs.
        n_dev = len({st.ops.device_key for st in self.stages})
        sizes = choose_schedule(n_tokens, n_dev, self.profile, start=start,
                                max_chunk=self.profile.max_chunk,
                                stages_per_device=len(self.stages) / n_dev)
        even = len(set(sizes[:-1])) <= 1 and sizes[-1] <= sizes[0]
        return sizes[0] if even else sizes

    def cost_profile(self, start=0):
        """The cost profile of this engine's ProfileKey (model shape, device, expert placement and
        cache, stage layout, KV type): the saved one, else one made now by a short calibration
        (seconds, once; saved for later runs). Its max_chunk is what free memory holds now.
        Calibrating writes KV positions from `start` on, so a prefix cached below `start` stays
        valid."""
        from lite.chain.calibrate import (CalibrationError, calibrate_engine, memory_max_chunk,
                                          profile_key)
        key = profile_key(self)
        prof = CostProfile.load(key)
        if prof is None:
            log.warning("no cost profile for %s: calibrating for a few seconds, once "
                        "(`lite calibrate` measures more)", key)
            try:
                prof = calibrate_engine(self, quick=True, floor=start)
            except CalibrationError as e:      # a context too small to time: rough defaults
                log.warning("%s; --prefill auto uses the default cost profile", e)
                prof = CostProfile().with_key(key)
            else:
                try:
                    prof.save()
                except OSError as e:
                    log.warning("cost profile not saved (%s): the next run calibrates again", e)
        prof.max_chunk = memory_max_chunk(self)
        return prof

    # --- the forward -------------------------------------------------------------------------
    def _prefill_chain(self, ids, start, all_logits):
        self.stages[-1].all_logits = all_logits
        self.n_requests += 1
        chunk = self.chunk_for(len(ids), start)
        self.last_chunk = chunk
        return self.chain.prefill(as_ids(ids), chunk, request_id=self.n_requests, start=start)

    def prefill(self, ids, all_logits=False):
        """Run the prompt through the model; returns logits of the last position (n_vocab,) or,
        with all_logits, of every new position. Reuses the cached prefix where it matches."""
        ids = list(ids)
        if not ids:
            raise LiteError("empty prompt: nothing to run")
        self.stages[0].kv.check_fits(len(ids))
        if self.cfg.is_hybrid and self.chunk == "auto" and self.profile is None:
            self.profile = self.cost_profile(0)   # it moves the recurrent states: before reuse
        reuse = 0 if all_logits else _common_prefix(self.cached_ids, ids)
        reuse = min(reuse, len(ids) - 1)      # at least one position runs, to give logits
        if self.cfg.is_hybrid:
            reuse = self._recurrent_reuse(reuse)
        self.cached_ids = ids[:reuse]
        try:
            outs = self._prefill_chain(ids[reuse:], reuse, all_logits)
        except StageError as e:
            if not isinstance(e.__cause__, MemoryError):
                raise
            raise DeviceError(
                f"out of memory during prefill in chunks of {self.last_chunk} tokens: lower "
                f"--prefill or -c/--max-context"
                + (", or keep experts on the host (--experts host)" if self.cfg.is_moe else "")) from None
        self.cached_ids = ids
        self.last_reuse = reuse
        return np.concatenate(outs) if all_logits else outs[-1][-1]

    def _recurrent_reuse(self, common):
        """How much of a shared prefix of `common` tokens a hybrid can reuse: its recurrent states
        cannot be rewound, so where they stand if that is inside the prefix, else the latest
        checkpoint inside it (restored on every stage), else nothing."""
        states = self._recurrent_states()
        if not states:
            return common
        if common and common == len(self.cached_ids) and {s.at() for s in states} == {common}:
            reuse = common
        else:
            saved = set.intersection(*(set(s.checkpoints) for s in states))
            reuse = max((p for p in saved if p <= common), default=0)
            if reuse:
                for s in states:
                    s.restore(reuse)
        self.drop_checkpoints(reuse)     # past it the cache will hold this prompt's tokens
        return reuse

    def _recurrent_states(self):
        return [st.kv.recurrent for st in self.stages if st.kv is not None and st.kv.recurrent]

    def drop_checkpoints(self, pos):
        """Forget a hybrid's recurrent checkpoints past pos: they no longer describe the cached tokens."""
        for s in self._recurrent_states():
            s.drop_after(pos)

    def decode_step(self, token):
        pos = len(self.cached_ids)
        self.stages[0].kv.check_fits(pos + 1)
        self.stages[-1].all_logits = False
        job = ChunkJob.decode_step(self.n_requests, pos, as_ids([token]))
        logits = self.chain.decode(job.input, job)[-1]
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
            if not np.isfinite(logits[tok]):    # NaN/inf anywhere: the sampler picks one (sampling.py)
                raise NonFiniteLogitsError(
                    f"logits not finite at step {i}: the file may be corrupted; run "
                    f"`lite info --verify {self.gguf.path}`")
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
