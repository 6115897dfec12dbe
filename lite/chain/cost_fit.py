"""Fitting the chunk-size cost model (lite/chain/chunking.py) to timings: `calibrate` from chunk timings
(one chunk at a context through the whole stack, what lite/chain/calibrate.py measures on a device) and
`fit_table` from whole-prefill timings (a recorded cost table, lite/chain/cost_tables.py).

Both are one least-squares problem with coefficients >= 0: every term of the model is a constant
times a known function of the schedule, so a timing is a dot product of the constants with the
schedule's columns; the GEMM knee (min_gemm_chunk) is the grid value that fits best. Errors are
relative (small chunks count as much as large ones) and each point keeps its fastest repeat (noise
only adds)."""
import logging
import math

import numpy as np

from lite.chain.chunking import distinct_experts
from lite.chain.cost_profile import CostProfile, ProfileKey
from lite.errors import LiteError

log = logging.getLogger(__name__)

DEFAULT_CHUNKS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_CONTEXTS = (0, 4096)
TERMS = ("fixed_s", "per_token_s", "attn_s", "attn_chunk_s", "expert_s", "stage_fixed_s",
         "handoff_s")


def _nnls(A, b):
    """Least squares with coefficients >= 0: drop the most negative one and refit until none is."""
    active = [j for j in range(A.shape[1]) if A[:, j].any()]
    coef = np.zeros(A.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(A[:, active], b, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


def columns(sizes, start, n_stages, shape, stages_per_device=1, slowest=-1):
    """The model's prediction for a schedule as columns, one per TERMS entry: the predicted
    seconds are their dot product with the constants. `shape` is a CostProfile giving
    min_gemm_chunk, attn_share, the expert routing and overlap, and (for the overlap) the
    current estimate of the constants, which says whether a chunk's copy or compute is the
    longer: the shorter one's columns count (1 - overlap). The fill/drain term counts chunk
    `slowest` (S > 1: the one with the largest time, which the caller finds by iterating)."""
    c = np.asarray(sizes, float)
    pos = start + np.concatenate([[0.0], np.cumsum(c)[:-1]])
    S, k = float(n_stages), float(stages_per_device)
    compute = np.stack([np.maximum(c, shape.min_gemm_chunk), shape.attn_share * c * pos,
                        shape.attn_share * c * (c + 1) / 2], 1)
    copy = distinct_experts(c, shape)
    o = shape.expert_overlap
    if o:
        copy_bound = (shape.expert_s * copy
                      >= compute @ [shape.per_token_s, shape.attn_s, shape.attn_chunk_s])
        compute = compute * np.where(copy_bound, 1 - o, 1.0)[:, None]
        copy = copy * np.where(copy_bound, 1.0, 1 - o)
    per_chunk = np.concatenate([np.ones((len(c), 1)), compute, copy[:, None]], 1) / S
    stage = np.stack([k * np.ones_like(c), (k * c) if S * k > 1 else np.zeros_like(c)], 1)
    per_chunk = np.concatenate([per_chunk, stage], 1)
    return per_chunk.sum(0) + (S - 1) * per_chunk[slowest]


def _fit(rows, shape, m, terms, overlap=0.0):
    """rows: [(sizes, start, S, k, seconds)]. Returns (profile, relative residual). The slowest
    chunk and which of copy and compute is longer depend on the constants: iterate."""
    shape = CostProfile(**{**shape.__dict__, "min_gemm_chunk": m, "expert_overlap": overlap})
    use = [TERMS.index(t) for t in terms]
    t = np.array([r[-1] for r in rows])
    w = 1.0 / t     # relative error: small chunks count as much as large ones
    slowest = [len(r[0]) - 1 for r in rows]
    prev = None
    for _ in range(8):
        A = np.array([columns(s, p, S, shape, kk, j)[use]
                      for (s, p, S, kk, _), j in zip(rows, slowest)])
        coef = _nnls(A * w[:, None], t * w)
        shape = CostProfile(**{**shape.__dict__, **dict(zip(terms, coef))})
        slowest = [int(np.argmax([columns([c], p + sum(s[:i]), S, shape, kk)[use] @ coef
                                  for i, c in enumerate(s)])) if S > 1 else len(s) - 1
                   for (s, p, S, kk, _) in rows]
        if prev is not None and np.allclose(coef, prev, rtol=1e-9, atol=0):
            break
        prev = coef
    resid = float(np.sum(((A @ coef - t) * w) ** 2))
    return shape, resid


def _knee_grid(chunks):
    """Candidate min_gemm_chunk values: the chunk sizes and their geometric midpoints."""
    cs = sorted({int(c) for c in chunks})
    mids = [int(round(math.sqrt(a * b))) for a, b in zip(cs, cs[1:])]
    return sorted(set(cs) | set(mids))


OVERLAPS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


def fit(rows, shape, chunks, terms, fit_overlap=False):
    """The best-fitting profile over the knee grid (and the overlap grid when fit_overlap): the
    smallest knee that fits (almost) as well as the best one, since a linear cost fits every
    knee below its real one."""
    fits = {}
    for m in _knee_grid(chunks):
        fits[m] = min((_fit(rows, shape, m, terms, o) for o in
                       (OVERLAPS if fit_overlap else (shape.expert_overlap,))),
                      key=lambda f: f[1])
    best = min(r for _, r in fits.values())
    m = min(m for m, (_, r) in fits.items() if r <= best * 1.05 + 1e-12)
    return fits[m][0]


def calibrate(measure_fn, chunks=DEFAULT_CHUNKS, contexts=DEFAULT_CONTEXTS, handoff_fn=None,
              repeats=3, key=None, max_chunk=None, samples=None, attn_share=1.0, n_expert=0,
              expert_top_k=0, expert_curve=(), fit_overlap=False):
    """Fit a CostProfile from timings.

    measure_fn(chunk, context) -> seconds: one chunk of `chunk` tokens through the whole layer stack
    on one device, attending `context` earlier tokens. handoff_fn(tokens) -> seconds (optional):
    one hand-off of that many tokens' hidden states plus the chain's per-chunk overhead; its
    intercept becomes stage_fixed_s and its slope handoff_s. attn_share and the expert routing
    (n_expert, expert_top_k, expert_curve) are the model's, not fitted; with fit_overlap (experts
    copied from the host beside the compute) the overlap is fitted too. With `samples` (a list),
    the timings kept are appended as (chunk, context, seconds) and ("handoff", tokens, seconds)."""
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
    key = key or ProfileKey("", "")
    shape = CostProfile(attn_share=attn_share, n_expert=n_expert, expert_top_k=expert_top_k,
                        expert_curve=expert_curve, **key.__dict__)
    terms = ["fixed_s", "per_token_s", "attn_chunk_s", "expert_s"]
    if len(set(contexts)) > 1:
        terms.append("attn_s")
    if not (n_expert and expert_top_k) and not expert_curve:
        terms.remove("expert_s")
    prof = fit([([c], ctx, 1, 1, t) for c, ctx, t in points], shape, chunks, terms,
               fit_overlap and "expert_s" in terms)
    if "attn_s" not in terms:       # one context: the in-chunk fit is the best guess for both
        prof.attn_s = prof.attn_chunk_s
    if handoff_fn is not None:
        ts = np.array([best_of(handoff_fn, c) for c in chunks])
        A = np.stack([np.ones(len(chunks)), np.array(chunks, float)], 1)
        prof.stage_fixed_s, prof.handoff_s = (float(v) for v in _nnls(A, ts))
        if samples is not None:
            samples.extend(("handoff", c, float(t)) for c, t in zip(chunks, ts))
    else:
        prof.stage_fixed_s = prof.handoff_s = 0.0
    prof.max_chunk = int(max_chunk or prof.max_chunk)
    log.info("calibrated %s: %s", key, prof)
    return prof


def fit_table(rows, shape, n_stages=1, stages_per_device=1, start=0, fit_overlap=False):
    """A CostProfile fitted to whole-prefill timings: rows [(sizes, seconds)] on one stage layout
    (the per-stage terms are folded into the per-chunk and per-token ones). `shape` gives the
    routing, the attention share and the key."""
    if len(rows) < 3:
        raise LiteError(f"fit_table needs at least 3 timings, got {len(rows)}")
    data = [(list(s), start, n_stages, stages_per_device, float(t)) for s, t in rows]
    terms = ["fixed_s", "per_token_s", "attn_s", "attn_chunk_s"]
    if (shape.n_expert and shape.expert_top_k) or shape.expert_curve:
        terms.append("expert_s")
    flat = CostProfile(**{**shape.__dict__, "stage_fixed_s": 0.0, "handoff_s": 0.0})
    chunks = sorted({c for s, _ in rows for c in s})
    return fit(data, flat, chunks, terms, fit_overlap and "expert_s" in terms)
