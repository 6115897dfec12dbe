"""The scheduler: one thread owns the engine and runs every request in slots, step by step.

Requests wait in a bounded queue and are admitted into at most n_slots running sequences. Each
step is one job of the engine's stage chain (a StepJob through StageChain.decode; each stage runs
Stage.forward_batch, or replays a decode graph) over the stacked rows of all of them: one row for
every sequence that is decoding, plus up to `chunk` prompt tokens of the sequences still
prefilling, so a long prompt delays the others' next token by one chunk at most. A sequence's KV
lives in blocks of the paged pool (lite/engine/paged_kv.py); its prompt's full blocks are looked up in
the prefix cache on admission, and every block it fills is keyed there for later requests.
A step of decode rows only (no prompt chunk) replays CUDA graphs on GPU stages
(lite/engine/paged_cuda.py DecodeGraphs).
"""
import logging
import threading
import time
from collections import deque

import numpy as np

from lite.errors import LiteError, NonFiniteLogitsError
from lite.engine.kv_cache import RecurrentState
from lite.engine.paged_cuda import DecodeGraphs
from lite.engine.paged_kv import DEFAULT_BLOCK_SIZE, BlockManager, BlockPool, PagedKV, block_hashes
from lite.chain.pipeline import StepJob
from lite.engine.sequence import Sequence

log = logging.getLogger(__name__)

DEFAULT_CHUNK = 256
DEFAULT_MAX_QUEUE = 128


class QueueFull(LiteError):
    """Every slot is busy and the queue holds as many requests as it may."""


class SchedulerStopped(LiteError):
    """The scheduler thread ended on an error: no request can run any more."""


def describe(e):
    return f"{type(e).__name__}: {e}"


class Scheduler:
    def __init__(self, engine, n_slots=4, max_queue=DEFAULT_MAX_QUEUE, block_size=DEFAULT_BLOCK_SIZE,
                 chunk=None, graphs=True, on_failure=None, timeline=None):
        if engine.device not in ("cpu", "cuda"):
            raise LiteError(f"lite serve runs on the CPU or a CUDA GPU, not {engine.device!r}")
        if engine.device == "cuda" and engine.kv_kind not in ("f16", "int8"):
            raise LiteError(f"lite serve on the GPU keeps its KV as f16 or int8, not --kv {engine.kv_kind}")
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.n_slots, self.max_queue = int(n_slots), int(max_queue)
        self.ctx = engine.max_context
        chunk = chunk or engine.chunk
        self.chunk = int(chunk) if chunk != "auto" else DEFAULT_CHUNK
        # every slot can always reach the full context: blocks shared through the prefix cache
        # count once, and keyed blocks nobody uses are taken back on demand
        n_blocks = self.n_slots * -(-self.ctx // block_size)
        self.blocks = BlockManager(n_blocks, block_size)
        self.pools = []
        for st in engine.stages:            # each stage's pool on its own device (GPU stages)
            with st.ops.activate():
                self.pools.append(BlockPool(engine.cfg, st.spec.layers, n_blocks, block_size,
                                            engine.kv_kind, st.ops.xp))
        cfg = engine.cfg
        # per stage, its recurrent layers (a hybrid; none otherwise): each sequence owns their states
        self.recurrent_layers = ([[il for il in st.spec.layers if cfg.is_recurrent_layer(il)]
                                  for st in engine.stages] if cfg.is_hybrid else [])
        # graphs=False (the tests' twin run): every step eager, as on the CPU
        self.graphs = DecodeGraphs(engine.stages, self.pools, self.n_slots, self.ctx, enabled=graphs)
        self.timeline = timeline            # a Timeline the chain records every step's stages on, or None
        self.waiting, self.running = deque(), []
        self.cv = threading.Condition()
        self.counters = dict.fromkeys(
            ("requests", "requests_finished", "requests_cancelled", "requests_failed",
             "requests_rejected", "prompt_tokens", "prompt_tokens_cached", "generated_tokens",
             "steps"), 0)
        self._next_id = 0
        self._stopping = False
        self.failure = None                 # what ended the scheduler thread, if anything did
        self.on_failure = on_failure        # called (from that thread) once it has
        self._thread = threading.Thread(target=self._run, name="lite-scheduler", daemon=True)

    # --- the HTTP side (any thread) ------------------------------------------------------------
    def start(self):
        self._thread.start()
        return self

    def stop(self, timeout=10.0):
        with self.cv:
            self._stopping = True
            self.cv.notify()
        self._thread.join(timeout)

    def submit(self, prompt_ids, params, emit, constraint=None):
        """Queue a request (`constraint`: a grammar's Constraint, lite/server/grammar.py); returns
        its Sequence. Raises QueueFull when the queue is full."""
        if not prompt_ids:
            raise LiteError("empty prompt: nothing to run")
        with self.cv:
            if self.failure is not None:
                raise SchedulerStopped(f"the scheduler has stopped: {describe(self.failure)}")
            # waiting requests that free slots will take at the next step do not count as queued
            if len(self.waiting) - (self.n_slots - len(self.running)) >= self.max_queue:
                self.counters["requests_rejected"] += 1
                raise QueueFull(f"the server is busy: {len(self.running)} requests running and "
                                f"{len(self.waiting)} waiting; try again later")
            self._next_id += 1
            seq = Sequence(self._next_id, prompt_ids, params, emit, self.tokenizer.decoder())
            seq.constraint = constraint
            budget = self.ctx - seq.n_prompt
            seq.max_tokens = budget if params.max_tokens is None else min(params.max_tokens, budget)
            self.waiting.append(seq)
            self.counters["requests"] += 1
            self.cv.notify()
        return seq

    def cancel(self, seq):
        """Drop a request (its client went away): its slot and blocks are freed before the next step."""
        with self.cv:
            seq.cancelled = True
            self.cv.notify()

    def metrics(self):
        with self.cv:
            m = dict(self.counters)
            m.update(slots_busy=len(self.running), slots_total=self.n_slots,
                     queue_length=len(self.waiting), queue_max=self.max_queue,
                     kv_blocks_free=self.blocks.n_free, kv_blocks_total=self.blocks.n_blocks,
                     kv_blocks_cached=self.blocks.n_cached, kv_block_size=self.blocks.block_size,
                     graph_replays=self.graphs.replays)
        return m

    # --- the scheduler thread ------------------------------------------------------------------
    def _run(self):
        """The thread: the loop, and if anything escapes it (a bug, not one request's failure),
        every request ends with an error and on_failure is told, so the server stops, not hangs."""
        try:
            self._loop()
        except BaseException as e:
            log.critical("the scheduler stopped: %s", describe(e), exc_info=e)
            with self.cv:
                self.failure = e
                for s in [*self.running, *self.waiting]:
                    self._emit_error(s, e)
                self.running, self.waiting = [], deque()
            if self.on_failure is not None:
                self.on_failure(e)

    def _loop(self):
        while True:
            with self.cv:
                self._drop_cancelled()
                while not self._stopping and not self.running and not self.waiting:
                    self.cv.wait()
                    self._drop_cancelled()
                if self._stopping:
                    return
                self._admit()
            if self.running:
                self._step()

    def _drop_cancelled(self):
        for seq in [s for s in self.running if s.cancelled]:
            self._retire(seq)
            self.counters["requests_cancelled"] += 1
        for seq in [s for s in self.waiting if s.cancelled]:
            self.waiting.remove(seq)
            self.counters["requests_cancelled"] += 1

    def _admit(self):
        B = self.blocks.block_size
        while self.waiting and len(self.running) < self.n_slots:
            seq = self.waiting.popleft()
            self.running.append(seq)        # from here on a failure retires it and frees its blocks
            seq.t_admit = time.perf_counter()
            try:
                # the prompt's last position always runs: its logits give the first token
                keys = block_hashes(seq.tokens[:seq.n_prompt - 1], B)
                # a hybrid's recurrent state cannot be rebuilt from KV blocks: its prompt runs whole
                seq.blocks = [] if self.recurrent_layers else self.blocks.match(keys)
                seq.recurrent = [self._recurrent_state(st, layers)
                                 for st, layers in zip(self.engine.stages, self.recurrent_layers)]
                seq.keys = keys[:len(seq.blocks)]
                seq.n_computed = seq.cached_tokens = len(seq.blocks) * B
            except Exception as e:
                self._fail(seq, e)
                continue
            self.counters["prompt_tokens"] += seq.n_prompt
            self.counters["prompt_tokens_cached"] += seq.cached_tokens

    def _recurrent_state(self, stage, layers):
        with stage.ops.activate():          # on the stage's device, like its pool
            return RecurrentState(self.engine.cfg, layers, stage.ops.xp)

    def _plan(self):
        """This step's rows: (sequence, token count) for every decoding sequence, then prompt
        chunks of the prefilling ones, oldest first, up to `chunk` tokens. A prompt's chunks end
        at multiples of `chunk` in its own positions (a chunk that does not fit waits a step), so
        its rows' rounding is the same however many prompts share the step."""
        plan = [(s, 1) for s in self.running if not s.prefilling]
        budget = self.chunk
        for s in self.running:
            if s.prefilling:
                n = min(self.chunk - s.n_computed % self.chunk, s.pending)
                if n <= budget:
                    plan.append((s, n))
                    budget -= n
        return plan

    def _step(self):
        plan = self._plan()
        B = self.blocks.block_size
        try:
            with self.cv:
                for s, n in plan:
                    while len(s.blocks) * B < s.n_computed + n:
                        s.blocks.append(self.blocks.allocate())
            x = self._forward(plan, self.counters["steps"], self.timeline)
        except Exception as e:          # the server stays up: these requests fail, others go on
            with self.cv:
                for s, _ in plan:
                    self._fail(s, e)
            return
        with self.cv:
            self.counters["steps"] += 1
            for j, (s, n) in enumerate(plan):
                try:
                    s.n_computed += n
                    self._key_full_blocks(s)
                    if s.pending == 0 and not s.cancelled:
                        self._advance(s, x[j])
                except Exception as e:  # this row's sampling, decoding or stop strings
                    self._fail(s, e)

    def _forward(self, plan, index=0, timeline=None):
        """The step's rows through the stage chain (StageChain.decode of a StepJob): the last
        stage's logits, a row per sequence."""
        ids = np.asarray([t for s, n in plan for t in s.tokens[s.n_computed:s.n_computed + n]],
                         np.int32)
        starts, counts = [s.n_computed for s, _ in plan], [n for _, n in plan]
        graph_step = self.graphs.step(ids, starts, counts, [s.blocks for s, _ in plan])

        def kv_views(si):                   # each sequence's KV in stage si's pool
            return [PagedKV(self.pools[si], s.blocks, self.ctx,
                            s.recurrent[si] if s.recurrent else None) for s, _ in plan]
        job = StepJob(index, ids, starts, counts, kv_views, self.graphs, graph_step)
        return self.engine.chain.decode(ids, job, timeline)

    def _key_full_blocks(self, s):
        B = self.blocks.block_size
        done = s.n_computed // B
        if done > len(s.keys):
            parent = s.keys[-1] if s.keys else None
            for b, key in enumerate(block_hashes(s.tokens[len(s.keys) * B:done * B], B, parent),
                                    len(s.keys)):
                self.blocks.register(s.blocks[b], key)
                s.keys.append(key)

    def _advance(self, s, logits):
        """Sample the next token of a sequence whose pending tokens have all run."""
        c = s.constraint
        if s.params.ignore_eos:             # benchmarks: exactly max_tokens, as llama-server and vLLM do
            logits = np.array(logits, np.float32)
            logits[list(self.tokenizer.eog_ids)] = -np.inf
        tok = s.sampler(logits if c is None else c.mask(logits), s.tokens)
        if not np.isfinite(logits[tok]):
            raise NonFiniteLogitsError("the model's logits are not finite (NaN or inf)")
        if s.t_first is None:
            s.t_first = time.perf_counter()
        if tok in self.tokenizer.eog_ids:
            return self._finish(s, "stop")         # the end-of-generation token is not sent
        if c is not None and not c.advance(tok):   # only broken logits draw a masked token: _step fails it
            raise LiteError(f"the grammar refused token {tok}: {c.error}")
        s.tokens.append(tok)
        s.generated += 1
        self.counters["generated_tokens"] += 1
        text, hit = s.stop.push(s.decoder.push(tok))
        if text:
            s.emit({"text": text})
        if hit:
            self._finish(s, "stop", flush=False)
        elif c is not None and c.done:             # the grammar is complete
            self._finish(s, "stop")
        elif s.generated >= s.max_tokens:
            self._finish(s, "length")

    def _finish(self, s, reason, flush=True):
        if flush:
            text, _ = s.stop.push(s.decoder.flush())
            text += s.stop.flush()
            if text:
                s.emit({"text": text})
        s.emit({"finish": reason, "stop_sequence": s.stop.stopped, "usage": s.usage(),
                "timings": s.timings(time.perf_counter())})
        self._retire(s)
        self.counters["requests_finished"] += 1

    def _fail(self, s, e):
        """End one request on an error of its own (the caller holds cv): it gets an error event,
        its slot and blocks are freed, and the others go on."""
        log.error("request %d failed: %s", s.id, describe(e), exc_info=e)
        self._emit_error(s, e)
        if s in self.running:
            self._retire(s)
        self.counters["requests_failed"] += 1

    @staticmethod
    def _emit_error(s, e):
        try:
            s.emit({"error": describe(e)})
        except Exception:               # a broken client callback must not take the loop down
            log.exception("request %d: its error could not be sent", s.id)

    def _retire(self, s):
        self.running.remove(s)
        self.blocks.release(s.blocks)
        s.blocks = []


# --- the counters above as Prometheus text (exposition format 0.0.4), for /metrics ----------------
METRICS = [  # (key in Scheduler.metrics(), name, type, help)
    ("requests", "lite_requests_total", "counter", "Requests accepted into the queue."),
    ("requests_finished", "lite_requests_finished_total", "counter", "Requests that ran to the end."),
    ("requests_cancelled", "lite_requests_cancelled_total", "counter",
     "Requests cancelled, most by a client that went away."),
    ("requests_failed", "lite_requests_failed_total", "counter", "Requests that failed in the engine."),
    ("requests_rejected", "lite_requests_rejected_total", "counter", "Requests refused: queue full."),
    ("prompt_tokens", "lite_prompt_tokens_total", "counter", "Prompt tokens of admitted requests."),
    ("prompt_tokens_cached", "lite_prompt_tokens_cached_total", "counter",
     "Prompt tokens served from the prefix cache."),
    ("generated_tokens", "lite_generated_tokens_total", "counter", "Tokens generated."),
    ("steps", "lite_steps_total", "counter", "Batched forward steps run."),
    ("graph_replays", "lite_graph_replays_total", "counter",
     "Stage forwards of decode steps replayed from a captured CUDA graph."),
    ("slots_busy", "lite_slots_busy", "gauge", "Slots running a request."),
    ("slots_total", "lite_slots_total", "gauge", "Slots (-np)."),
    ("queue_length", "lite_queue_length", "gauge", "Requests waiting for a slot."),
    ("queue_max", "lite_queue_max", "gauge", "Requests that may wait before new ones get 503."),
    ("kv_blocks_free", "lite_kv_blocks_free", "gauge",
     "KV blocks no request holds (prefix-cached ones included: they are reused on demand)."),
    ("kv_blocks_total", "lite_kv_blocks_total", "gauge", "KV blocks in the pool."),
    ("kv_blocks_cached", "lite_kv_blocks_cached", "gauge", "KV blocks keyed in the prefix cache."),
    ("kv_block_size", "lite_kv_block_size", "gauge", "Positions per KV block."),
]


def prometheus_text(values):
    lines = []
    for key, name, kind, help_ in METRICS:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {values[key]}"]
    return "\n".join(lines) + "\n"


def parse_prometheus(text):
    """{name: value} of a plain exposition (no labels): what the tests and scripts read back."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
