"""Prefill chunk sizes from a cost model: `choose_chunk(prompt_tokens, n_stages, profile)` (one
size) and `choose_schedule(...)` (the sizes along the prompt, possibly uneven).

One chunk of c tokens whose first token sits at position p costs the whole layer stack on one
device (the constants of a CostProfile, lite/chain/cost_profile.py):

    cost(c, p) = fixed + compute + copy - overlap * min(compute, copy)
    compute    = per_token * max(c, min_gemm_chunk)            GEMMs (below a minimum, no cheaper)
               + share * attn * c * p                          attending the tokens before it
               + share * attn_chunk * c * (c + 1) / 2          causal attention inside the chunk
    copy       = expert * distinct(c)                          experts the chunk touches

`share` is the share of layers with full attention (1, or fewer on hybrid and sliding-window
models). distinct(c) is the number of distinct experts per MoE layer that c tokens touch: with
top-k routing over E experts, E * (1 - (1 - k/E)^c) when tokens route independently, or a
measured curve. With experts streamed from the host, `expert` is the bytes of one expert over all
MoE layers that miss the GPU cache, over the host link bandwidth: a larger chunk amortises the
copy of every expert it touches, and the copies run on their own stream beside the compute
(`overlap` 1: the longer of the two is all that counts; 0: they add up). attn_chunk is attn
when the kernel skips masked tiles and up to 2 attn when it computes them; the difference is the
only attention cost chunking can change.

With layers split evenly over S devices, a device's time for a chunk is

    t(c, p) = k * stage_fixed + k * handoff * c (S*k > 1) + cost(c, p) / S

(k stages on each device: stages on one device cannot overlap, so S counts devices and the
per-stage terms are paid k times). All devices take the same time per chunk (a proportionate flow
shop), so chunks c_0..c_{n-1} finish after sum_j t_j + (S - 1) * max_j t_j: the stream of chunks
through one device, plus the pipeline filling and draining. Even chunks cost more the later they
start (attention), so with S > 1 a schedule of sizes shrinking along the prompt, every chunk
about as long as the others, lowers max_j t_j; `choose_schedule` keeps it where the chain's
step-by-step schedule (`chain_time`, the hand-off depth included) says it wins.

The upper limit on a chunk is memory (activations and attention scratch, `memory_chunk_limit`),
never a constant: with experts on the host the best chunk is often the whole prompt.
"""
import math

import numpy as np

from lite.chain.cost_profile import (MEMORY_CHUNK_LIMIT, PROFILE_VERSION, CostProfile,  # noqa: F401
                                     ProfileError, ProfileKey, profile_path)
from lite.errors import LiteError

MIN_CHUNK = 16          # below this a chunk is all launch overhead on any device
SCHEDULE_STEP = 64      # sizes of an uneven schedule are multiples of this (GEMM tiles)
SCHEDULE_GAIN = 0.005   # an uneven schedule must win by this share to replace even chunks
ALIGN_SLACK = 0.01      # a GEMM-aligned size this close to the best predicted one is chosen


def distinct_experts(c, p):
    """Distinct experts per MoE layer that a chunk of c tokens touches (0 for a dense model)."""
    c = np.asarray(c, float)
    if p.expert_curve:
        xs, ys = zip(*p.expert_curve)
        return np.interp(np.log(np.maximum(c, 1)), np.log(xs), ys)
    E, k = p.n_expert, p.expert_top_k
    if not E or not k:
        return np.zeros_like(c)
    return E * (1 - (1 - k / E) ** c)


def stack_time(c, pos, p):
    """The profile's seconds for one chunk of c tokens at position pos through the whole layer
    stack on one device (what calibration measures). Takes arrays."""
    c = np.asarray(c, float)
    compute = (p.per_token_s * np.maximum(c, p.min_gemm_chunk)
               + p.attn_share * (p.attn_s * c * pos + p.attn_chunk_s * c * (c + 1) / 2))
    copy = p.expert_s * distinct_experts(c, p)
    t = p.fixed_s + compute + copy - p.expert_overlap * np.minimum(compute, copy)
    return float(t) if t.ndim == 0 else t


def _per_stage_terms(S, k, p):
    """(fixed seconds, seconds per token) a device pays per chunk for its k stages' own overhead:
    k stage_fixed and k hand-offs (each stage reads and writes one; none with a single stage)."""
    k = float(k)
    if k < 1:
        raise LiteError(f"stages per device must be >= 1, got {k}")
    return k * p.stage_fixed_s, (k * p.handoff_s if S * k > 1 else 0.0)


def device_times(sizes, n_stages, profile, start=0, stages_per_device=1):
    """One device's seconds for each chunk of a schedule (array)."""
    sizes = np.asarray(sizes, float)
    pos = start + np.concatenate([[0.0], np.cumsum(sizes)[:-1]])
    fixed, per_tok = _per_stage_terms(n_stages, stages_per_device, profile)
    return fixed + per_tok * sizes + stack_time(sizes, pos, profile) / n_stages


def even_sizes(prompt_tokens, chunk):
    """The sizes `--prefill chunk` runs: chunks of `chunk`, the last one shorter."""
    P, c = int(prompt_tokens), min(int(chunk), int(prompt_tokens))
    n_full, r = divmod(P, c)
    return [c] * n_full + ([r] if r else [])


def as_sizes(prompt_tokens, chunk):
    """A chunk size or a schedule (sizes summing to the prompt) as a list of sizes."""
    if isinstance(chunk, (int, np.integer)):
        if chunk < 1:
            raise LiteError(f"chunk size must be >= 1, got {chunk}")
        return even_sizes(prompt_tokens, chunk)
    sizes = [int(c) for c in chunk]
    if min(sizes, default=0) < 1 or sum(sizes) != int(prompt_tokens):
        raise LiteError(f"a schedule's sizes must be >= 1 and sum to the prompt "
                        f"({prompt_tokens}), got {sizes}")
    return sizes


def predict_time(prompt_tokens, chunk, n_stages, profile, start=0, stages_per_device=1):
    """Predicted prefill seconds of `prompt_tokens` tokens (after `start` already cached) in chunks
    of `chunk` (a size, or a schedule of sizes) over `n_stages` devices (stages that overlap),
    each holding `stages_per_device` stages: sum_j t_j + (S - 1) max_j t_j."""
    P, S = int(prompt_tokens), int(n_stages)
    if P <= 0:
        return 0.0
    if S < 1:
        raise LiteError(f"stage count must be >= 1, got {S}")
    t = device_times(as_sizes(P, chunk), S, profile, start, stages_per_device)
    return float(t.sum() + (S - 1) * t.max())


def chain_time(times, n_stages, depth=1):
    """The stage chain's makespan step by step for chunk times `times` (every device the same):
    a device starts a chunk when its input has arrived and it has handed its previous chunk on,
    which waits while the successor still holds `depth` earlier chunks (lite/chain/pipeline.py)."""
    S, n = int(n_stages), len(times)
    finish = [[0.0] * n for _ in range(S)]
    handed = [[0.0] * n for _ in range(S)]
    for j, t in enumerate(times):
        for k in range(S):
            arrive = handed[k - 1][j] if k else 0.0
            free = handed[k][j - 1] if j else 0.0
            finish[k][j] = max(arrive, free) + t
            taken = finish[k + 1][j - depth] if k + 1 < S and j >= depth else 0.0
            handed[k][j] = max(finish[k][j], taken)
    return finish[S - 1][n - 1] if n else 0.0


def candidate_chunks(prompt_tokens, max_chunk, min_chunk=MIN_CHUNK):
    """Chunk sizes worth trying: powers of two (GEMM-friendly, what users pass), multiples of 128
    up to 2048 and steps of at most ~6% above (so the best of them is within a few percent of any
    size), the whole prompt, and the prompt split into 2..16 equal chunks rounded up to 64 (so a
    prompt is not left with a tiny last chunk that pays the fixed cost for little work)."""
    hi = min(int(prompt_tokens), int(max_chunk))
    if hi <= min_chunk:
        return [max(1, hi)]
    out = {hi}
    c = 1 << max(0, (min_chunk - 1).bit_length())
    while c <= hi:
        out.add(c)
        c *= 2
    out.update(range(128, min(hi, 2048) + 1, 128))
    c = 2048
    while c <= hi:
        out.add(c)
        c += max(256, (c // 16) // 256 * 256)
    for n in range(2, 17):
        c = -(-prompt_tokens // n)
        c = -(-c // 64) * 64
        if min_chunk <= c <= hi:
            out.add(c)
    return sorted(x for x in out if x >= min_chunk)


def choose_chunk(prompt_tokens, n_stages, profile, candidates=None, start=0, max_chunk=None,
                 stages_per_device=1):
    """The candidate chunk size with the smallest predicted makespan, or one within ALIGN_SLACK
    of it that is a multiple of a larger power of two (up to 256; the larger one on a tie: fewer
    chunks, fewer launches). n_stages counts devices (stages that can overlap); pass
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
    times = {c: predict_time(P, c, n_stages, profile, start, stages_per_device)
             for c in candidates}
    best_t = min(times.values())
    # Within the model's error of the best, a size whose GEMM tiles divide it evenly (or the
    # whole prompt in one chunk) wins: the model knows no tile quantization.
    close = [c for c, t in times.items() if t <= best_t * (1 + ALIGN_SLACK)]
    return max(close, key=lambda c: (_alignment(c, P), -times[c], c))


def _alignment(c, prompt_tokens):
    """How evenly GEMM tiles divide a chunk: its power-of-two factor, up to 256 (8)."""
    return 8 if c == prompt_tokens else min(8, (c & -c).bit_length() - 1)


def equal_time_sizes(prompt_tokens, n_chunks, n_stages, profile, start=0, stages_per_device=1,
                     max_chunk=None, step=SCHEDULE_STEP):
    """About n_chunks sizes (multiples of `step`, the last the remainder) whose device times are
    about equal: larger where little context comes before them, smaller later."""
    P, S, k = int(prompt_tokens), int(n_stages), stages_per_device
    cap = max(step, int(max_chunk or profile.max_chunk) // step * step)

    fixed, per_tok = _per_stage_terms(S, k, profile)
    pr, E, top = profile, profile.n_expert, profile.expert_top_k
    curve = bool(pr.expert_curve)

    def one(c, pos):                # device_times of one chunk, in scalars (called often)
        d = (float(distinct_experts(c, pr)) if curve else
             E * (1 - (1 - top / E) ** c) if E and top else 0.0)
        compute = (pr.per_token_s * max(c, pr.min_gemm_chunk)
                   + pr.attn_share * (pr.attn_s * c * pos + pr.attn_chunk_s * c * (c + 1) / 2))
        copy = pr.expert_s * d
        return (fixed + per_tok * c + (pr.fixed_s + compute + copy
                                       - pr.expert_overlap * min(compute, copy)) / S)

    def greedy(T):
        sizes, pos, c_max = [], start, min(cap, -(-P // step) * step) // step   # in steps
        while pos < start + P:
            if not sizes:                   # the largest first chunk whose time stays within T
                lo, hi = 1, c_max
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if one(mid * step, pos) <= T:
                        lo = mid
                    else:
                        hi = mid - 1
            else:                           # later chunks start later: never larger, step down
                lo = c_max
                while lo > 1 and one(lo * step, pos) > T:
                    lo -= 1
            c_max = lo
            c = min(lo * step, start + P - pos)
            sizes.append(c)
            pos += c
            if len(sizes) > n_chunks + 1:
                break
        return sizes

    lo_t, hi_t = 0.0, one(min(P, cap), start + P - min(P, cap)) * 2
    while hi_t - lo_t > 1e-3 * hi_t:        # a makespan to 0.1%: the gain must be 0.5%
        mid = (lo_t + hi_t) / 2
        if len(greedy(mid)) <= n_chunks:
            hi_t = mid
        else:
            lo_t = mid
    return greedy(hi_t)


def choose_schedule(prompt_tokens, n_stages, profile, start=0, max_chunk=None,
                    stages_per_device=1, depth=1):
    """The sizes to prefill `prompt_tokens` tokens in: the best even chunks (choose_chunk), or,
    with S > 1 devices, an uneven schedule of about as many chunks whose times are equal
    (equal_time_sizes) when the chain's schedule (chain_time) finishes it sooner by
    SCHEDULE_GAIN. Returns a tuple of sizes summing to the prompt. Pure."""
    P, S, k = int(prompt_tokens), int(n_stages), stages_per_device
    c = choose_chunk(P, S, profile, start=start, max_chunk=max_chunk, stages_per_device=k)
    best = tuple(even_sizes(P, c))
    if S == 1 or len(best) == 1:
        return best                 # nothing overlaps, or nothing to even out

    def makespan(sizes):
        return chain_time(device_times(sizes, S, profile, start, k), S, depth)

    best_t = makespan(best)
    even_t = best_t
    for n in range(max(2, len(best) - 1), len(best) + 2):
        sizes = tuple(equal_time_sizes(P, n, S, profile, start, k, max_chunk))
        t = makespan(sizes)
        if t < best_t:
            best, best_t = sizes, t
    return best if best_t < even_t * (1 - SCHEDULE_GAIN) else tuple(even_sizes(P, c))


def describe_schedule(sizes):
    """A schedule as text: '4096x2' for even chunks, '4096x2+1808', else runs joined by '+'."""
    runs = []
    for c in sizes:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return "+".join(f"{c}x{n}" if n > 1 else str(c) for c, n in runs)


def memory_chunk_limit(free_bytes, bytes_per_token, bytes_per_token_context=0.0, context=0,
                       step=SCHEDULE_STEP, limit=MEMORY_CHUNK_LIMIT):
    """The largest chunk (a multiple of `step`, at most `limit`) whose activations
    (bytes_per_token each) and attention scratch (bytes_per_token_context per token per attended
    position, the chunk's own included, at up to `context` positions before it) fit free_bytes."""
    a, b, ctx = float(bytes_per_token), float(bytes_per_token_context), float(context)
    if free_bytes <= 0:
        return step
    if b > 0:   # c * (a + b * (ctx + c)) <= free: the positive root of b c^2 + (a + b ctx) c - free
        q = a + b * ctx
        c = (-q + math.sqrt(q * q + 4 * b * free_bytes)) / (2 * b)
    else:
        c = free_bytes / max(a, 1.0)
    return int(max(step, min(limit, c // step * step)))
