"""Token sampling on the host, in llama.cpp's order: repetition penalty, top-k, top-p, min-p,
temperature, then a draw. A temperature at or below MIN_TEMPERATURE is greedy. The same seed gives the same draws; seed
None or -1 draws a fresh one (llama.cpp's -1). StopMatcher (below) ends the text at a stop string."""
import math
from dataclasses import dataclass

import numpy as np

from lite.errors import NonFiniteLogitsError

# below this, dividing the logits by the temperature overflows to inf (and the draw to NaN), and
# the draw is the argmax anyway
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def __post_init__(self):
        for name in ("temperature", "top_p", "min_p", "repeat_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name.replace('_', ' ')} must be a finite number, got {getattr(self, name)}")
        if self.seed is not None and self.seed < -1:
            raise ValueError(f"seed must be >= 0, or -1 for a random one, got {self.seed}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min-p must be in [0, 1], got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat penalty must be > 0, got {self.repeat_penalty}")

    @classmethod
    def greedy(cls):
        return cls(temperature=0.0)


class Sampler:
    def __init__(self, params: SamplingParams):
        self.p = params
        self.rng = np.random.default_rng(None if params.seed == -1 else params.seed)

    def __call__(self, logits, history=()):
        """logits (n_vocab,) float32 on the host -> token id."""
        p = self.p
        logits = np.asarray(logits, dtype=np.float32)
        if p.repeat_penalty != 1.0 and len(history):
            logits = logits.copy()
            recent = np.unique(np.asarray(history[-p.repeat_last_n:], dtype=np.int64))
            vals = logits[recent]
            logits[recent] = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        # With a NaN or +inf logit, argmax returns one (and with all -inf, a -inf one): the
        # engine checks the drawn token's logit, so broken logits stop generation there.
        if p.temperature <= MIN_TEMPERATURE or not np.isfinite(logits.max()):
            return int(np.argmax(logits))
        # candidates sorted by logit, descending
        idx = top_k_sorted(logits, p.top_k) if p.top_k and p.top_k < logits.size else None
        if idx is None:
            if p.top_k and p.top_k < logits.size:
                idx = np.argpartition(-logits, p.top_k - 1)[: p.top_k]
            else:
                idx = np.arange(logits.size)
            idx = idx[np.argsort(-logits[idx], kind="stable")]
        z = logits[idx].astype(np.float64)
        probs = np.exp(z - z[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            idx, z, probs = idx[:keep], z[:keep], probs[:keep]
        if p.min_p > 0:
            keep = probs >= p.min_p * probs[0]
            idx, z = idx[keep], z[keep]
        z = z / p.temperature
        w = np.exp(z - z.max())
        w /= w.sum()
        if not np.isfinite(w).all():
            raise NonFiniteLogitsError(f"the sampling probabilities are not finite (temperature "
                                       f"{p.temperature}, {idx.size} candidates)")
        return int(idx[self.rng.choice(idx.size, p=w)])


SAMPLE_STRIDE = 16     # top_k_sorted's threshold comes from every 16th logit


def top_k_sorted(logits, k):
    """The ids of the k largest logits, largest first, from a pre-selection instead of a partition
    of the whole vocabulary (the partition of 128K logits was most of a sampled token's host time):
    the k-th largest of every SAMPLE_STRIDE-th logit bounds the k-th largest overall from below, so
    every logit at or above it holds the top k. None when the k + 1 largest are not all distinct
    (or the vocabulary is too small to gain): the full partition then decides which of equal
    logits come first, as it always has, so the draws stay the same."""
    sample = logits[::SAMPLE_STRIDE]
    if sample.size <= 4 * k:
        return None
    thr = np.partition(sample, sample.size - k)[sample.size - k]
    sel = np.flatnonzero(logits >= thr)            # at least k ids, the top k among them
    if sel.size > 4 * SAMPLE_STRIDE * (k + 1):     # many equal logits at the threshold
        return None
    vals = logits[sel]
    order = np.argsort(-vals, kind="stable")[: k + 1]
    top = vals[order]
    if np.any(top[1:] == top[:-1]):
        return None
    return sel[order[:k]]


# --- stop strings ------------------------------------------------------------------------------
# Stop strings over streamed text: generation ends where one appears, and no part of it is shown.
#
# A stop string may arrive split across tokens ("<|e" then "nd|>"), so text that could be the start
# of a stop string is held back until the next piece settles it. Pure: no model, no engine.
#
#     m = StopMatcher(["\n\n", "User:"])
#     for piece in pieces:
#         text, stopped = m.push(piece)
#         emit(text)
#         if stopped:
#             break
#     else:
#         emit(m.flush())


class StopMatcher:
    def __init__(self, stops=()):
        self.stops = [s for s in dict.fromkeys(stops) if s]   # order kept, empties dropped
        self._held = ""
        self.stopped = None        # the stop string that ended the text, once one has

    def push(self, piece):
        """Add a piece of text; returns (text safe to show now, whether a stop string was found).
        After a stop, the text after it is dropped and further pushes return ("", True)."""
        if self.stopped is not None:
            return "", True
        buf = self._held + piece
        if not self.stops:
            return buf, False
        hit = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (hit is None or i < hit[0]):
                hit = (i, s)
        if hit is not None:
            self._held = ""
            self.stopped = hit[1]
            return buf[:hit[0]], True
        keep = self._partial(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self):
        """The text held back, when the stream ends without a stop string."""
        out, self._held = self._held, ""
        return "" if self.stopped is not None else out

    def _partial(self, buf):
        """The length of the longest end of `buf` that begins some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
