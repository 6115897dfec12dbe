"""The Python API: `from lite import LLM`.

    llm = LLM("smollm2")                       # a known alias (fetched once) or a path to a GGUF file
    print(llm.generate("The capital of France is", max_tokens=16, temperature=0))
    for piece in llm.stream("Tell me a story", max_tokens=64):
        print(piece, end="", flush=True)
    print(llm.chat([{"role": "user", "content": "Hi!"}]))
"""
from lite.engine import Engine, GenStats
from lite.hub import resolve_model
from lite.sampling import Sampler, SamplingParams

_SAMPLING_KEYS = {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed"}


class LLM:
    def __init__(self, model=None, device="auto", max_context=None, kv="f16",
                 prefill_chunk=None, layer_split=None, pipeline="chain", handoff_depth=1,
                 devices=None, handoff="host", handoff_stream=False, experts="auto", expert_cache="auto",
                 config=None):
        self.engine = Engine(resolve_model(model), device=device, max_context=max_context, kv=kv,
                             prefill_chunk=prefill_chunk, layer_split=layer_split,
                             pipeline=pipeline, handoff_depth=handoff_depth, devices=devices,
                             handoff=handoff, handoff_stream=handoff_stream, experts=experts,
                             expert_cache=expert_cache, config=config)
        self.tokenizer = self.engine.tokenizer
        self.last_stats = None

    @property
    def config(self):
        return self.engine.cfg

    @property
    def device(self):
        return self.engine.device

    def tokenize(self, text, add_special=True, parse_special=True):
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids):
        return self.tokenizer.decode(ids)

    def stream_ids(self, prompt_ids, max_tokens=128, **sampling):
        unknown = set(sampling) - _SAMPLING_KEYS
        if unknown:
            raise TypeError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        sampler = Sampler(SamplingParams(**sampling))
        self.last_stats = GenStats()
        yield from self.engine.generate(prompt_ids, max_tokens, sampler, self.last_stats)

    def stream(self, prompt, max_tokens=128, **sampling):
        """Yield text pieces as they are decoded (whole UTF-8 characters only)."""
        dec = self.tokenizer.decoder()
        for tok in self.stream_ids(self.tokenize(prompt), max_tokens, **sampling):
            piece = dec.push(tok)
            if piece:
                yield piece
        tail = dec.flush()
        if tail:
            yield tail

    def generate(self, prompt, max_tokens=128, **sampling) -> str:
        return "".join(self.stream(prompt, max_tokens, **sampling))

    def chat_prompt(self, messages):
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def chat(self, messages, max_tokens=256, stream=False, **sampling):
        """Answer a conversation (a list of {"role", "content"}); the file's chat template renders it."""
        pieces = self.stream(self.chat_prompt(messages), max_tokens, **sampling)
        return pieces if stream else "".join(pieces)

    def serve(self, host="127.0.0.1", port=8080, n_slots=4, api_key=None, alias=None, **kw):
        """Serve this model over the OpenAI API until interrupted (what `lite serve` runs)."""
        from lite.server.launch import serve
        serve(engine=self.engine, host=host, port=port, n_slots=n_slots, api_key=api_key,
              alias=alias, **kw)
