"""Calibration of the chunk-size cost model on an engine's own device (`lite calibrate`, and the
first `--prefill auto` on a device and model shape that has no saved profile yet).

What is measured (docs/design.md "The chunk model"; the model is at the top of lite/chain/chunking.py):
- one prefill chunk of c tokens after ctx tokens through the whole layer stack: every stage's
  run() in turn on the caller's thread, each followed by a device synchronize, so the time is the
  devices' compute, whatever the stage split (a hand-off between stages on different devices is
  made outside the clock). Fitted into fixed_s, per_token_s, attn_s and min_gemm_chunk.
- one hand-off of c tokens' hidden states (the first stage's to_handoff into a host buffer, the
  next stage's from_handoff, synchronized), plus the chain's own cost per stage-chunk (a worker
  thread's submit and wake-up, timed on a StageChain of stages that do nothing). Fitted into
  stage_fixed_s (intercept) and handoff_s (slope). Measured even with one stage, because the
  profile is per device and model shape, not per split.

The profile is keyed (lite/chain/cost_profile.py ProfileKey, `profile_key`) by the model shape, the
device, where the experts live and the expert cache's share, the stage layout and the KV type; the
routing (experts, top-k) and the share of full-attention layers come from the model's config, not
from the fit. The largest chunk comes from free memory (`memory_max_chunk`).

Calibration writes the KV cache of positions `floor` and above, so a prefix cached below `floor`
stays valid. It takes seconds: chunk sizes double from 1024 on, so the grid costs about twice its
largest point per context and repeat; the largest sizes are dropped until that fits the budget.
"""
import functools
import logging
from time import perf_counter

import numpy as np

from lite.chain.chunking import choose_schedule, memory_chunk_limit, predict_time
from lite.chain.cost_fit import calibrate
from lite.chain.cost_profile import ProfileKey
from lite.errors import LiteError
from lite.chain.pipeline import ChunkJob, HostHandoff, StageChain

log = logging.getLogger(__name__)

MIN_CALIBRATION_CONTEXT = 128   # room for chunks of 16, 32 and 64 plus some context
QUICK_BUDGET_S = 8.0            # first use: a few seconds, once per ProfileKey
FULL_BUDGET_S = 60.0            # `lite calibrate`
PROMPTS = (2048, 4096, 8192, 16384, 32768, 65536)
ACTIVATION_SAFETY = 2.0         # GEMM input copies, quantized activations, allocator slack
ATTN_SCRATCH_BYTES = 2 << 30    # the GPU's materialized attention batches its heads within this
MEMORY_USE = 0.8                # share of what is free that one prefill chunk may take


class CalibrationError(LiteError):
    """The engine cannot be calibrated as asked (context too small for the grid)."""


def profile_device(engine):
    """The device part of a profile's name: 'cpu', or 'cuda-' + the GPU model(s), so that a
    profile made on one GPU model is not used on another through a shared cache directory."""
    if engine.device != "cuda":
        return str(engine.device)
    try:
        names = {_gpu_name(st.ops.device.id) for st in engine.stages}
    except Exception as e:      # a profile name is no reason to fail: fall back to the kind
        log.info("GPU name unknown (%s): profile saved under 'cuda'", e)
        return "cuda"
    return "cuda-" + "+".join(sorted(names))


@functools.lru_cache(maxsize=None)
def _gpu_name(device_id):
    """The GPU's model name (asked once per device: --prefill auto asks at every prompt)."""
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(device_id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def stage_layout(engine):
    """(devices, stages per device): stages on one device cannot overlap (chunking.py)."""
    n_dev = len({st.ops.device_key for st in engine.stages})
    return n_dev, len(engine.stages) / n_dev


def attention_share(cfg):
    """The share of layers whose attention spans the whole context: sliding-window layers attend
    a bounded window, recurrent (hybrid) layers none."""
    n = cfg.n_layer
    full = sum(not cfg.is_swa_layer(i) for i in range(n)) if cfg.sliding_window else n
    interval = int(cfg.extra.get("full_attention_interval", 0) or 0)
    if interval > 1:            # hybrid: every interval-th layer has attention
        full = min(full, n // interval)
    return max(full, 1) / n


def expert_setting(engine):
    """(placement, cache share) of the experts: ("none", "") for a dense model, ("gpu", "") with
    them in VRAM ("device", "" on a backend that never moves them), else ("host" | "mmap", the
    GPU expert cache as a whole percent of the experts' bytes, summed over stages)."""
    if not engine.cfg.is_moe:
        return "none", ""
    placed = [st.residency for st in engine.stages if getattr(st, "residency", None)]
    modes = sorted({r.mode for r in placed})
    if not placed:              # a backend that keeps every expert with the dense weights
        return "device", ""
    if modes == ["gpu"]:
        return "gpu", ""
    total = sum(t.nbytes for n, t in engine.gguf.tensors.items() if n.endswith("_exps.weight"))
    cached = sum(r.cache_bytes for r in placed)
    return "+".join(modes), f"{round(100 * min(cached / total, 1.0)) if total else 0}%"


def profile_key(engine):
    """Everything that changes the cost model's terms for this engine (cost_profile.ProfileKey)."""
    n_dev, k = stage_layout(engine)
    experts, cache = expert_setting(engine)
    return ProfileKey(model_key=engine.model_key, device=profile_device(engine), experts=experts,
                      expert_cache=cache, stages=f"{n_dev}x{k:g}", kv=engine.stages[0].kv.kind)


def activation_bytes(cfg, device):
    """(bytes per token, bytes per token per attended position) one prefill chunk allocates:
    hidden states, Q/K/V, the FFN's (or the routed experts') intermediates; on the CPU also the
    attention scores, which the GPU's flash kernel never materializes."""
    qkv = (cfg.n_head * cfg.head_dim + cfg.n_head_kv * (cfg.head_dim + cfg.v_head_dim))
    if cfg.is_moe:
        ffn = cfg.n_expert_used * (cfg.n_embd + 3 * cfg.n_ff_expert) + 3 * cfg.n_ff_shexp
    else:
        ffn = 3 * cfg.n_ff
    per_token = ACTIVATION_SAFETY * 4 * (6 * cfg.n_embd + 2 * qkv + ffn)
    per_ctx = 12.0 * cfg.n_head if device != "cuda" else 0.0   # scores f32, mask, probabilities
    return per_token, per_ctx


def free_bytes(engine):
    """The smallest free memory over the devices the stages run on (VRAM, or the host's RAM),
    divided among the stages that share a device."""
    n_dev, k = stage_layout(engine)
    if engine.device != "cuda":
        import os
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = 8 << 30
        return free / len(engine.stages)
    import cupy
    frees = []
    for st in engine.stages:
        with st.ops.activate():
            free = cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes()
        frees.append(free - ATTN_SCRATCH_BYTES)
    return min(frees) / k


def memory_max_chunk(engine):
    """The largest prefill chunk the free memory holds (chunking.memory_chunk_limit), at most
    the context."""
    per_token, per_ctx = activation_bytes(engine.cfg, engine.device)
    cap = memory_chunk_limit(MEMORY_USE * free_bytes(engine), per_token, per_ctx,
                             engine.max_context)
    return max(1, min(cap, engine.max_context))


def plan_points(max_context, max_chunk=16384, context=8192, floor=0):
    """Chunk sizes (powers of four from 16 to 1024, then of two: the sizes a prompt is cut into,
    where the in-chunk attention term shows; and the largest) and the two contexts to time them at,
    all within positions floor..max_context: the largest chunk is at most half the room, so the
    second context (up to `context` tokens above floor) leaves attention room to show. Large
    chunks matter: with experts copied from the host, compute outgrows the copies only there."""
    room = int(max_context) - int(floor)
    if room < MIN_CALIBRATION_CONTEXT:
        raise CalibrationError(
            f"calibration needs at least {MIN_CALIBRATION_CONTEXT} free positions in the context, "
            f"got {room} (raise -c/--max-context)")
    top = 1 << (min(int(max_chunk), room // 2).bit_length() - 1)
    chunks = sorted({c for c in [16, 64, 256] + [1024 << i for i in range(8)] if c <= top} | {top})
    hi = floor + min(int(context), room - top)
    return chunks, ([floor, hi] if hi > floor else [floor])


def _ids(engine, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, min(engine.cfg.n_vocab, 32000), size=n).astype(np.int32)


def measure_stack(engine, chunk, context):
    """Seconds for one chunk of `chunk` tokens at position `context` through every stage
    (their device compute only; see the module docstring)."""
    stages = engine.stages
    job = ChunkJob(0, 0, context, context + chunk, _ids(engine, chunk, chunk), last=True)
    for st in stages:
        st.ops.synchronize()
    x, total = job.input, 0.0
    for i, st in enumerate(stages):
        t0 = perf_counter()
        y = st.run(job, x)
        st.ops.synchronize()
        total += perf_counter() - t0
        if i + 1 < len(stages):
            nxt = stages[i + 1]
            if nxt.ops.device_key == st.ops.device_key:
                x = y
            else:                     # another device: through host memory, off the clock
                buf = st.alloc_handoff(y.shape, y.dtype)
                st.to_handoff(y, buf)
                x = nxt.from_handoff(buf)
                nxt.ops.synchronize()
    return total


class HandoffProbe:
    """Times one hand-off of `tokens` hidden states between the first two stages (a stage to
    itself when there is one), into a host buffer allocated once at the largest size."""

    def __init__(self, engine, max_tokens):
        self.src = engine.stages[0]
        self.dst = engine.stages[1] if len(engine.stages) > 1 else self.src
        self.n_embd = engine.cfg.n_embd
        self.buf = self.src.alloc_handoff((int(max_tokens), self.n_embd), np.float32)
        self.ys = {}

    def __call__(self, tokens):
        ops = self.src.ops
        if tokens not in self.ys:
            with ops.activate():    # hidden states are float32 on both backends: (T, n_embd)
                self.ys[tokens] = ops.xp.zeros((tokens, self.n_embd), np.float32)
        y, buf = self.ys[tokens], self.buf[:tokens]
        ops.synchronize()
        t0 = perf_counter()
        self.src.to_handoff(y, buf)
        self.dst.from_handoff(buf)
        self.dst.ops.synchronize()
        return perf_counter() - t0


class _Null(HostHandoff):
    def run(self, job, x):
        return x


def chain_hop_seconds(n_jobs=32, repeats=3):
    """The stage chain's own cost per stage-chunk: two stages that do nothing, n_jobs chunks
    (they overlap, so the run takes about n_jobs + 1 stage-chunk times)."""
    jobs = [ChunkJob(0, i, i, i + 1, np.zeros((1, 4), np.float32)) for i in range(n_jobs)]
    with StageChain([_Null(), _Null()], device_times=False) as chain:
        chain.run(jobs[:2])                  # start the worker threads outside the clock
        best = float("inf")
        for _ in range(repeats):
            t0 = perf_counter()
            chain.run(jobs)
            best = min(best, perf_counter() - t0)
    return best / (n_jobs + 1)


def calibrate_engine(engine, quick=False, budget_s=None, repeats=None, context=8192,
                     max_chunk=16384, floor=0, samples=None):
    """Measure and fit a CostProfile for the engine's device and model shape (not saved).

    quick: the first-use calibration (repeats 2, a ~8 s budget); else `lite calibrate`'s (repeats
    3, ~60 s). `samples` (a list) receives the kept timings, as chunking.calibrate writes them."""
    repeats = int(repeats or (2 if quick else 3))
    budget_s = float(budget_s or (QUICK_BUDGET_S if quick else FULL_BUDGET_S))
    chunks, contexts = plan_points(engine.max_context, max_chunk, context, floor)
    last = engine.stages[-1]
    keep_all_logits, last.all_logits = last.all_logits, False   # logits of one row, as prefill
    try:
        measure_stack(engine, chunks[0], contexts[0])       # compiles kernels: off the budget
        # Probe upwards at the larger context; stop before the chunk with which the whole grid
        # would pass the budget (its time guessed from the last one's, as sqrt of the growth:
        # between copy-bound, flat, and compute-bound, linear).
        spent, kept, t = 0.0, [], 0.0
        for c in chunks:
            guess = t * (c / kept[-1]) ** 0.5 if kept else 0.0
            if len(kept) >= 3 and (spent + guess) * repeats * len(contexts) > budget_s:
                break
            t = measure_stack(engine, c, contexts[-1])
            spent += t
            kept.append(c)
        if kept != chunks:
            log.info("calibration: chunks up to %d fit the %.0f s budget", kept[-1], budget_s)
        probe = HandoffProbe(engine, kept[-1])
        hop = chain_hop_seconds()
        cfg = engine.cfg
        prof = calibrate(lambda c, ctx: measure_stack(engine, c, ctx), kept, contexts,
                         handoff_fn=lambda n: probe(n) + hop, repeats=repeats,
                         key=profile_key(engine), max_chunk=memory_max_chunk(engine),
                         samples=samples, attn_share=attention_share(cfg),
                         n_expert=cfg.n_expert, expert_top_k=cfg.n_expert_used,
                         fit_overlap=expert_setting(engine)[0] not in ("none", "gpu"))
    finally:
        last.all_logits = keep_all_logits
        # positions from `floor` on now hold calibration keys and values, not the cached prompt
        engine.cached_ids = engine.cached_ids[:floor]
        engine.drop_checkpoints(floor)
    return prof


def chosen_chunks(profile, n_devices=1, stages_per_device=1, prompts=PROMPTS):
    """[(prompt tokens, chosen schedule, predicted seconds)] for a table of prompt lengths."""
    out = []
    for P in prompts:
        sizes = choose_schedule(P, n_devices, profile, stages_per_device=stages_per_device)
        out.append((P, sizes, predict_time(P, sizes, n_devices, profile,
                                           stages_per_device=stages_per_device)))
    return out


def check_prediction(engine, profile, n_tokens, chunks=()):
    """Prefill n_tokens through the engine's StageChain with the schedule choose_schedule picks
    (and each chunk of `chunks`); returns [(chunk or schedule, predicted s, measured s)]. Clears
    the prefix cache."""
    n_dev, k = stage_layout(engine)
    if n_tokens > engine.max_context:
        raise CalibrationError(f"a check of {n_tokens} tokens needs -c/--max-context >= "
                               f"{n_tokens}, got {engine.max_context}")
    sizes = choose_schedule(n_tokens, n_dev, profile, stages_per_device=k)
    auto = sizes[0] if len(set(sizes[:-1])) <= 1 and sizes[-1] <= sizes[0] else sizes
    last = engine.stages[-1]
    keep_all_logits, last.all_logits = last.all_logits, False
    rows = []
    try:
        for c in [auto] + sorted({min(int(c), n_tokens) for c in chunks} - {auto}):
            ids = _ids(engine, n_tokens, seed=n_tokens + len(rows))
            for st in engine.stages:
                st.ops.synchronize()
            t0 = perf_counter()
            engine.chain.prefill(ids, c)
            for st in engine.stages:
                st.ops.synchronize()
            rows.append((c, predict_time(n_tokens, c, n_dev, profile, stages_per_device=k),
                         perf_counter() - t0))
    finally:
        last.all_logits = keep_all_logits
        engine.cached_ids = []
        engine.drop_checkpoints(0)
    return rows
