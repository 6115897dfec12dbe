"""Prefill chunk size from a cost model: `choose_chunk(prompt_tokens, n_stages, profile)`.

A stage's time for one chunk of c tokens whose first token sits at position p (layers split evenly
over S stages; constants are for the whole layer stack on one device, see CostProfile):

    t(c, p) = stage_fixed + fixed/S                       launches, weight dequantization, sync
            + per_token/S * max(c, min_gemm_chunk)        GEMMs: below their minimum, no cheaper
            + attn/S * c * (p + (c + 1) / 2)              each token attends everything before it
            + handoff * c                 (S > 1 only)    hidden states out of and into the stage

All stages take the same time per chunk (a proportionate flow shop), so the makespan of chunks
c_0..c_{n-1} over S stages is sum_j t_j + (S - 1) * max_j t_j: the sum is the stream of chunks
through one stage, the rest is the pipeline filling and draining.

Virtual stages (k stages sharing one device, `stages_per_device=k`): stages on one device cannot
overlap, so S counts devices and a device's chunk time is the sum of its k stages' times: the
whole-stack terms still divide by the device count, but the per-stage terms (stage_fixed, handoff)
are paid k times. With one device and k stages a prefill costs the serial sum of every stage-chunk. Small chunks pay the fixed part
often; large chunks make the S-1 fill/drain chunk times long. The attention term summed over all
chunks is the same whatever the chunking; it only matters through the last, longest chunk.
The chain's one-outstanding-job rule never delays a stage here, because chunk times never shrink
except for the last, shorter chunk.
"""
import json
import logging
import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from lite.errors import LiteError

log = logging.getLogger(__name__)

PROFILE_VERSION = 1
MIN_CHUNK = 16          # below this a chunk is all launch overhead on any device


class ProfileError(LiteError):
    """A saved cost profile that cannot be read."""


@dataclass
class CostProfile:
    """Calibrated constants (seconds) for one device and one model shape."""
    fixed_s: float = 0.01              # per chunk, whole layer stack (split among stages)
    per_token_s: float = 1e-4          # per token, whole layer stack
    attn_s: float = 2.5e-9              # per token per attended context token, whole layer stack
    stage_fixed_s: float = 2e-4        # per chunk per stage, whatever its layer count
    handoff_s: float = 5e-7            # per token, out of one stage and into the next
    min_gemm_chunk: int = 256          # below this many tokens a chunk costs as much as this many
    max_chunk: int = 4096              # largest chunk the activations are sized for
    device: str = ""
    model_key: str = ""
    version: int = PROFILE_VERSION

    def __post_init__(self):
        for name in ("fixed_s", "per_token_s", "attn_s", "stage_fixed_s", "handoff_s"):
            v = float(getattr(self, name))
            if not math.isfinite(v) or v < 0:
                raise ProfileError(f"cost profile field {name} must be a finite number >= 0, "
                                   f"got {v!r}")
            setattr(self, name, v)
        self.min_gemm_chunk, self.max_chunk = int(self.min_gemm_chunk), int(self.max_chunk)
        if self.min_gemm_chunk < 1 or self.max_chunk < 1:
            raise ProfileError("cost profile min_gemm_chunk and max_chunk must be >= 1")

    def to_json(self):
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ProfileError(f"cost profile is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise ProfileError("cost profile must be a JSON object")
        if data.get("version") != PROFILE_VERSION:
            raise ProfileError(f"cost profile version {data.get('version')!r}, this lite "
                               f"reads version {PROFILE_VERSION}: calibrate again")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except (TypeError, ValueError) as e:
            raise ProfileError(f"bad cost profile: {e}") from e

    def save(self, root=None):
        path = profile_path(self.device, self.model_key, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)   # atomic: a concurrent reader never sees half a file
        return path

    @classmethod
    def load(cls, device, model_key, root=None):
        """The saved profile for this device and model shape, or None when there is none."""
        path = profile_path(device, model_key, root)
        if not path.exists():
            return None
        try:
            return cls.from_json(path.read_text())
        except ProfileError as e:
            raise ProfileError(f"{path}: {e}") from e


def profile_dir(root=None):
    if root is not None:
        return Path(root)
    from lite.hub import cache_dir
    return cache_dir() / "profiles"


def profile_path(device, model_key, root=None):
    safe = lambda s: re.sub(r"[^A-Za-z0-9._-]+", "_", str(s)).strip("_") or "any"
    return profile_dir(root) / f"{safe(device)}__{safe(model_key)}.json"


# --- the model --------------------------------------------------------------------------------

def _per_stage_terms(S, k, p):
    """(fixed seconds, seconds per token) a device pays per chunk for its k stages' own overhead:
    k stage_fixed and k hand-offs (each stage reads and writes one; none with a single stage)."""
    k = float(k)
    if k < 1:
        raise LiteError(f"stages per device must be >= 1, got {k}")
    return k * p.stage_fixed_s, (k * p.handoff_s if S * k > 1 else 0.0)


def _stage_time(c, pos, S, p, k=1):
    """One device's seconds for a chunk of c tokens starting at position pos (its k stages)."""
    fixed, per_tok = _per_stage_terms(S, k, p)
    return fixed + per_tok * c + (p.fixed_s + p.per_token_s * max(c, p.min_gemm_chunk)
                                  + p.attn_s * c * (pos + (c + 1) / 2)) / S


def predict_time(prompt_tokens, chunk, n_stages, profile, start=0, stages_per_device=1):
    """Predicted prefill seconds of `prompt_tokens` tokens (after `start` already cached) in
    chunks of `chunk` over `n_stages` devices (stages that can overlap), each holding
    `stages_per_device` stages. Closed form, O(1)."""
    P, S, p, k = int(prompt_tokens), int(n_stages), profile, stages_per_device
    if P <= 0:
        return 0.0
    if chunk < 1 or S < 1:
        raise LiteError(f"chunk and stage count must be >= 1 (got {chunk}, {S})")
    c = min(int(chunk), P)
    n_full, r = divmod(P, c)
    n = n_full + (r > 0)
    m = p.min_gemm_chunk
    fixed, per_tok = _per_stage_terms(S, k, p)
    total = (n * (fixed + p.fixed_s / S)
             + p.per_token_s / S * (n_full * max(c, m) + (max(r, m) if r else 0))
             + p.attn_s / S * (P * start + P * (P + 1) / 2)
             + per_tok * P)
    slowest = _stage_time(c, start + (n_full - 1) * c, S, p, k)   # the last full chunk
    if r:
        slowest = max(slowest, _stage_time(r, start + n_full * c, S, p, k))
    return total + (S - 1) * slowest


def candidate_chunks(prompt_tokens, max_chunk, min_chunk=MIN_CHUNK):
    """Chunk sizes worth trying: powers of two (GEMM-friendly, what users pass), multiples of 128
    up to 2048 and of 256 above (steps of at most ~12% where it matters, so the best of them is
    within a few percent of any size), the whole prompt, and the prompt split into 2..16 equal
    chunks rounded up to 64 (so a short prompt is not left with a tiny last chunk that pays the
    fixed cost for little work)."""
    hi = min(int(prompt_tokens), int(max_chunk))
    if hi <= min_chunk:
        return [max(1, hi)]
    out = {hi}
    c = 1 << max(0, (min_chunk - 1).bit_length())
    while c <= hi:
        out.add(c)
        c *= 2
    out.update(range(128, min(hi, 2048) + 1, 128))
    out.update(range(2048, hi + 1, 256))
    for n in range(2, 17):
        c = -(-prompt_tokens // n)
        c = -(-c // 64) * 64
        if min_chunk <= c <= hi:
            out.add(c)
    return sorted(x for x in out if x >= min_chunk)


def choose_chunk(prompt_tokens, n_stages, profile, candidates=None, start=0, max_chunk=None,
                 stages_per_device=1):
    """The candidate chunk size with the smallest predicted makespan (the larger one on a tie:
    fewer chunks, fewer launches). n_stages counts devices (stages that can overlap); pass
    stages_per_device for virtual stages. Pure: depends only on its arguments."""
    P = int(prompt_tokens)
    if P <= 0:
        raise LiteError(f"prompt must have at least one token, got {P}")
    cap = int(max_chunk or profile.max_chunk)
    if candidates is None:
        candidates = candidate_chunks(P, cap)
    else:
        candidates = sorted({min(int(c), P) for c in candidates if int(c) >= 1})
        if not candidates:
            raise LiteError("choose_chunk: no candidate chunk size >= 1")
    best, best_t = None, math.inf
    for c in candidates:
        t = predict_time(P, c, n_stages, profile, start, stages_per_device)
        if t <= best_t * (1 + 1e-9):
            best, best_t = c, t
    return best


# --- calibration ------------------------------------------------------------------------------

DEFAULT_CHUNKS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_CONTEXTS = (0, 4096)


def _attn_units(c, ctx):
    return c * (ctx + (c + 1) / 2)


def _nnls(A, b):
    """Least squares with coefficients >= 0: drop the most negative one and refit until none is."""
    active = list(range(A.shape[1]))
    coef = np.zeros(A.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(A[:, active], b, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


def _fit(points, m):
    c, ctx, t = (np.array(v, float) for v in zip(*points))
    A = np.stack([np.ones_like(c), np.maximum(c, m), _attn_units(c, ctx)], 1)
    w = 1.0 / t     # relative error: small chunks count as much as large ones
    coef = _nnls(A * w[:, None], t * w)
    resid = float(np.sum(((A @ coef - t) * w) ** 2))
    return coef, resid


def stack_time(c, ctx, p):
    """The profile's seconds for one chunk of c tokens after ctx tokens through the whole layer
    stack on one device (what calibrate's measure_fn measures)."""
    return p.fixed_s + p.per_token_s * max(c, p.min_gemm_chunk) + p.attn_s * _attn_units(c, ctx)


def calibrate(measure_fn, chunks=DEFAULT_CHUNKS, contexts=DEFAULT_CONTEXTS, handoff_fn=None,
              repeats=3, device="", model_key="", max_chunk=None, samples=None):
    """Fit a CostProfile from timings.

    measure_fn(chunk, context) -> seconds: one chunk of `chunk` tokens through the whole layer stack
    on one device, attending `context` earlier tokens. handoff_fn(tokens) -> seconds (optional):
    one hand-off of that many tokens' hidden states plus the chain's per-chunk overhead; its
    intercept becomes stage_fixed_s and its slope handoff_s. Each point keeps the fastest of
    `repeats` timings (noise only adds). min_gemm_chunk is the chunk grid value whose
    flat-below-it model fits best. With `samples` (a list), the timings kept are appended to it
    as (chunk, context, seconds) and ("handoff", tokens, seconds)."""
    chunks = sorted({int(c) for c in chunks})
    if len(chunks) < 3:
        raise LiteError("calibrate needs at least 3 chunk sizes")

    def best_of(fn, *args):
        return min(float(fn(*args)) for _ in range(max(1, repeats)))

    points = [(c, ctx, best_of(measure_fn, c, ctx)) for ctx in contexts for c in chunks]
    if any(not (t > 0 and math.isfinite(t)) for *_, t in points):
        raise LiteError(f"calibrate: measure_fn returned a non-positive time: {points}")
    if samples is not None:
        samples.extend(points)
    fits = {m: _fit(points, m) for m in chunks}
    best_resid = min(r for _, r in fits.values())
    # the smallest minimum that fits (almost) as well: a linear cost fits every m below its knee
    m = min(m for m, (_, r) in fits.items() if r <= best_resid * 1.05 + 1e-12)
    (fixed, per_token, attn), _ = fits[m]
    stage_fixed = handoff = 0.0
    if handoff_fn is not None:
        sizes = [c for c in chunks if c >= 1]
        ts = np.array([best_of(handoff_fn, c) for c in sizes])
        A = np.stack([np.ones(len(sizes)), np.array(sizes, float)], 1)
        stage_fixed, handoff = _nnls(A, ts)
        if samples is not None:
            samples.extend(("handoff", c, float(t)) for c, t in zip(sizes, ts))
    prof = CostProfile(fixed_s=fixed, per_token_s=per_token, attn_s=attn,
                       stage_fixed_s=stage_fixed, handoff_s=handoff, min_gemm_chunk=m,
                       max_chunk=int(max_chunk or max(chunks)), device=device,
                       model_key=model_key)
    log.info("calibrated %s / %s: %s", device, model_key, prof)
    return prof
