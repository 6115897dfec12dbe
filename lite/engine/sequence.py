"""One request inside the scheduler: its tokens, KV blocks, sampler, and what it sends back.

Only the scheduler thread changes a Sequence, except `cancelled`, which the HTTP side sets.
Events go out through `emit(event)`, a callable the HTTP side gives (it must be thread-safe):
    {"text": str}                                   text to append (whole characters, no stop text)
    {"finish": reason, "stop_sequence": str | None, "usage": {...}, "timings": {...}}
                                                    the last event: reason "stop" | "length"
    {"error": message}                              the last event when the step failed
"""
import time
from dataclasses import dataclass

from lite.engine.sampling import Sampler, SamplingParams
from lite.engine.sampling import StopMatcher


@dataclass(frozen=True)
class GenParams:
    max_tokens: int | None = None           # None: up to the end of the context
    sampling: SamplingParams = SamplingParams()
    stops: tuple = ()
    ignore_eos: bool = False                # the end-of-generation tokens are never drawn


class Sequence:
    def __init__(self, seq_id, prompt_ids, params, emit, decoder):
        self.id, self.params, self.emit = seq_id, params, emit
        self.tokens = [int(t) for t in prompt_ids]      # prompt, then the generated tokens
        self.n_prompt = len(self.tokens)
        self.n_computed = 0                 # positions whose KV is in the blocks
        self.blocks, self.keys = [], []     # block table; prefix-cache keys of its full blocks
        self.cached_tokens = 0              # prompt positions served from the prefix cache
        self.recurrent = None               # a hybrid's RecurrentState per stage (the scheduler's)
        self.generated = 0
        self.max_tokens = params.max_tokens
        self.sampler = Sampler(params.sampling)
        self.decoder = decoder              # the tokenizer's StreamDecoder
        self.stop = StopMatcher(params.stops)
        self.constraint = None              # a grammar's Constraint (lite/server/grammar.py)
        self.cancelled = False
        self.t_submit = time.perf_counter()
        self.t_first = self.t_admit = None

    @property
    def pending(self):
        """Tokens still to run through the model (prompt chunks, or the one just sampled)."""
        return len(self.tokens) - self.n_computed

    @property
    def prefilling(self):
        return self.n_computed < self.n_prompt

    def usage(self):
        return {"prompt_tokens": self.n_prompt, "completion_tokens": self.generated,
                "total_tokens": self.n_prompt + self.generated,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def timings(self, now):
        first = self.t_first or now
        return {"cache_n": self.cached_tokens, "prompt_n": self.n_prompt - self.cached_tokens,
                "prompt_ms": round((first - self.t_admit) * 1e3, 3),
                "predicted_n": self.generated, "predicted_ms": round((now - first) * 1e3, 3),
                "queued_ms": round((self.t_admit - self.t_submit) * 1e3, 3)}
