"""The Python API: `from lite import LLM`.

    llm = LLM("smollm2")                       # a known alias (fetched once) or a path to a GGUF file
    print(llm.generate("The capital of France is", max_tokens=16, temperature=0))
    for piece in llm.stream("Tell me a story", max_tokens=64, stop=["\\n\\n"]):
        print(piece, end="", flush=True)
    print(llm.chat([{"role": "user", "content": "Hi!"}]))

Special tokens: a text prompt (generate, stream, tokenize) is the caller's own, so its control-token
spellings ("<|im_start|>") become control tokens, as llama.cpp's `-p` and llama-cpp-python's
completions do (parse_special=False keeps them text); a chat message's content never does: only the
chat template's markup makes control tokens (chat, chat_ids).

One LLM serves one request at a time: its KV cache and prefix cache belong to the request that
runs. Calls from several threads queue on a lock and each gets the text it would get alone. A
stream holds the lock from its first piece until it ends, is closed, or is garbage-collected, so
an unfinished stream that is kept referenced blocks the other threads until it is closed
(`pieces.close()`, or leave the `for` loop: CPython closes a dropped generator at once).
"""
import logging
import os
import threading
from contextlib import contextmanager

from lite.engine.engine import Engine, GenStats
from lite.errors import ContextOverflowError, LiteError
from lite.files.hub import resolve_model
from lite.engine.sampling import Sampler, SamplingParams
from lite.engine.sampling import StopMatcher

log = logging.getLogger("lite")
_SAMPLING_KEYS = {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed"}


class LLM:
    def __init__(self, model=None, device="auto", max_context=None, kv="f16",
                 prefill_chunk=None, layer_split=None, pipeline="chain", handoff_depth=1,
                 devices=None, handoff="host", handoff_stream=False, experts="auto", expert_cache="auto",
                 config=None, threads=None, strict=False):
        if threads is not None:
            set_cpu_threads(threads)
        self.engine = Engine(resolve_model(model), device=device, max_context=max_context, kv=kv,
                             prefill_chunk=prefill_chunk, layer_split=layer_split,
                             pipeline=pipeline, handoff_depth=handoff_depth, devices=devices,
                             handoff=handoff, handoff_stream=handoff_stream, experts=experts,
                             expert_cache=expert_cache, config=config, strict=strict)
        self.tokenizer = self.engine.tokenizer
        self.strict = strict            # settings lite would warn about are errors
        self._warned_template = False
        self.last_stats = None          # GenStats of the latest request (the last to start)
        self._lock = threading.Lock()   # a plain Lock: a stream closed by the GC on another thread releases it
        self._owner = None

    @property
    def config(self):
        return self.engine.cfg

    @property
    def device(self):
        return self.engine.device

    @property
    def has_chat_template(self):
        """Whether the file carries its own chat template (`lite run` applies it by default then)."""
        return bool(self.tokenizer.chat_template)

    def tokenize(self, text, add_special=True, parse_special=True):
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids):
        return self.tokenizer.decode(ids)

    @contextmanager
    def _request(self):
        """Hold the engine for one request; the same thread asking again would wait for itself."""
        me = threading.get_ident()
        if self._owner == me:
            raise LiteError("this thread already has an unfinished stream on this LLM: finish it "
                            "or close() it before starting another request")
        with self._lock:
            self._owner = me
            try:
                yield
            finally:
                self._owner = None

    def stream_ids(self, prompt_ids, max_tokens=128, **sampling):
        """Yield generated token ids. max_tokens None (or negative): until an end-of-generation
        token or the end of the context."""
        unknown = set(sampling) - _SAMPLING_KEYS
        if unknown:
            raise TypeError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        sampler = Sampler(SamplingParams(**sampling))
        prompt_ids = list(prompt_ids)
        if max_tokens is None or max_tokens < 0:
            max_tokens = self.engine.max_context - len(prompt_ids)
            if max_tokens <= 0:
                raise ContextOverflowError(
                    f"prompt of {len(prompt_ids)} tokens fills the context of "
                    f"{self.engine.max_context} (raise -c/--ctx-size or shorten the prompt)")
        with self._request():
            stats = self.last_stats = GenStats()
            yield from self.engine.generate(prompt_ids, max_tokens, sampler, stats)

    def stream(self, prompt, max_tokens=128, stop=(), parse_special=True, **sampling):
        """Yield text pieces as they are decoded (whole UTF-8 characters only). Generation ends at
        the first of the `stop` strings, which is not yielded, nor is any part of it. `prompt`:
        text, or token ids (any id, control ones included)."""
        if isinstance(stop, str):
            stop = [stop]
        matcher = StopMatcher(stop)
        dec = self.tokenizer.decoder()
        ids = prompt if not isinstance(prompt, str) else self.tokenize(prompt, parse_special=parse_special)
        ids = self.stream_ids(ids, max_tokens, **sampling)
        try:
            for tok in ids:
                text, stopped = matcher.push(dec.push(tok))
                if text:
                    yield text
                if stopped:
                    self.last_stats.stop_reason = "stop"
                    return
            text, stopped = matcher.push(dec.flush())
            text += matcher.flush()
            if text:
                yield text
        finally:
            ids.close()                 # releases the engine now, not when the GC gets to it

    def generate(self, prompt, max_tokens=128, stop=(), parse_special=True, **sampling) -> str:
        return "".join(self.stream(prompt, max_tokens, stop, parse_special, **sampling))

    def chat_prompt(self, messages):
        """The conversation's text, for showing; chat_ids are its tokens (the contents as text)."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def chat_ids(self, messages):
        """The prompt's token ids for a conversation: the chat template's markup makes control
        tokens, the contents are text. A file without a chat template gets a built-in one (Gemma's
        or ChatML) with one warning, since a base model may never end its turn in it."""
        if not self.has_chat_template and not self._warned_template:
            self._warned_template = True
            msg = (f"{os.path.basename(self.engine.gguf.path)} has no chat template (a base "
                   f"model?): chat uses a built-in one, which it may not follow and may never end "
                   f"its turn in; plain completion (--no-chat, LLM.generate) suits it")
            if self.strict:
                raise LiteError(msg)
            log.warning(msg)
        return self.tokenizer.encode_chat(messages, add_generation_prompt=True)

    def chat(self, messages, max_tokens=256, stream=False, stop=(), **sampling):
        """Answer a conversation (a list of {"role", "content"}); the file's chat template renders it."""
        pieces = self.stream(self.chat_ids(messages), max_tokens, stop, **sampling)
        return pieces if stream else "".join(pieces)

    def serve(self, host="127.0.0.1", port=8080, n_slots=4, api_key=None, alias=None, **kw):
        """Serve this model over the OpenAI API until interrupted (what `lite serve` runs)."""
        from lite.server.launch import serve
        serve(engine=self.engine, host=host, port=port, n_slots=n_slots, api_key=api_key,
              alias=alias, **kw)

def set_cpu_threads(n):
    """Limit the threads of NumPy's BLAS (the CPU backend's matrix products) for this process."""
    if int(n) < 1:
        raise LiteError(f"-t/--threads must be a positive count, got {n}")
    from lite.backends.cpu import set_threads
    set_threads(n)
