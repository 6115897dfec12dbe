"""Make the generation fixtures from llama.cpp (the independent reference), through llama-cpp-python.

Run with a Python that has llama-cpp-python (it builds llama.cpp from source from the package
registry) and the two models fetched by lite (`lite.hub.model_path`), e.g.:
    python -m venv /tmp/llvenv && /tmp/llvenv/bin/pip install llama-cpp-python jinja2
    /tmp/llvenv/bin/python tests/make_generation_fixtures.py ~/.cache/lite/models
Writes tests/fixtures/generate.json, one key per model: for each prompt the text, the prompt token ids as
llama.cpp tokenizes them, the greedy continuation, and the top-5 logits at the last prompt position.
Chat prompts are rendered from the file's own chat template with Jinja2 (as llama-cpp-python does).

Two llama.cpp runs per model:
- "generated", "top5_*": llama.cpp on an F32 copy of the file (every tensor dequantized with
  gguf-py, exactly as lite's CPU path dequantizes it), so both evaluate the same weights in float32.
- "native_*": llama.cpp on the quantized file itself. Its CPU dot products quantize the activations
  to 8 bits (q8_0/q8_1/q8_K) first, which moves logits by 1-3% (measured: rms 0.16 on logits of
  std 3 for SmolLM2) and flips near-ties in long greedy runs; kept for comparison, not asserted.
"""
import json
import sys
from pathlib import Path

import tempfile

import jinja2
import llama_cpp
import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", 64),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", 16),
}
PLAIN = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
]
# A prompt longer than Gemma 3's 512-token sliding window, so that its local layers' window (and the
# chunked prefill of a long prompt) is checked too.
LONG = " ".join(
    f"Chapter {i}. The lighthouse keeper counted {i * 7 + 3} ships that night, wrote their names in "
    f"the ledger, and wondered whether the storm from the {['north', 'east', 'south', 'west'][i % 4]} "
    f"would reach the harbour before dawn." for i in range(1, 25)) + " In the morning, the keeper"
PLAIN.append(LONG)
CHATS = [
    [{"role": "user", "content": "What is the tallest mountain in the world?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "List three primary colors."}],
]


def builtin_render(name, messages):
    """A file without a chat template: llama.cpp's own built-in template of that name (C API)."""
    import ctypes
    arr = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode())
          for m in messages])
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), True, buf, len(buf))
    assert 0 < n < len(buf), n
    return buf.raw[:n].decode()


def render(template, messages, bos, eos):
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)


def f32_copy(src, dst):
    """The same model with every tensor dequantized to float32 (metadata copied as it is)."""
    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if f.types[0] == GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim > 1 else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_model(path, n_gen):
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_batch=512, n_threads=2, logits_all=True,
                          verbose=False, seed=0)
    meta = llm.metadata
    template = meta.get("tokenizer.chat_template")
    vocab = [llm.detokenize([i], special=True).decode("utf-8", "replace") for i in (llm.token_bos(), llm.token_eos())]
    cases = [{"kind": "plain", "text": t} for t in PLAIN]
    for msgs in CHATS:
        if template:
            text = render(template, msgs, vocab[0], vocab[1])
        else:
            text = builtin_render(meta["general.architecture"].rstrip("0123456789") or "chatml", msgs)
        # llama.cpp's chat code drops a BOS the template spells when tokenizing adds one anyway
        adds_bos = bool(llm.tokenize(b"", add_bos=True, special=True))
        if adds_bos and text.startswith(vocab[0]):
            text = text[len(vocab[0]):]
        cases.append({"kind": "chat", "messages": msgs, "text": text})
    out = []
    for case in cases:
        ids = llm.tokenize(case["text"].encode(), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        top = np.argsort(-last)[:5]
        gen = []
        for _ in range(n_gen):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            gen.append(tok)
            llm.eval([tok])
        out.append({**case, "prompt_ids": ids, "generated": gen,
                    "top5_ids": [int(i) for i in top], "top5_logits": [float(last[i]) for i in top],
                    "generated_text": llm.detokenize(gen).decode("utf-8", "replace")})
        print(f"{path.name}: {case['text'][:40]!r} -> {out[-1]['generated_text'][:60]!r}")
    return out


def main():
    models = Path(sys.argv[1] if len(sys.argv) > 1 else Path.home() / ".cache/lite/models")
    fixtures = Path(__file__).parent / "fixtures"
    fixtures.mkdir(exist_ok=True)
    for key, (fname, n_gen) in MODELS.items():
        with tempfile.TemporaryDirectory() as tmp:
            f32 = Path(tmp) / "model-f32.gguf"
            f32_copy(models / fname, f32)
            cases = run_model(f32, n_gen)
        native = run_model(models / fname, n_gen)
        for c, n in zip(cases, native):
            assert c["prompt_ids"] == n["prompt_ids"]
            c.update({f"native_{k}": n[k] for k in ("generated", "top5_ids", "top5_logits",
                                                    "generated_text")})
        doc = {"model": fname, "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
               "settings": "CPU, n_ctx 1024, f16 KV cache, greedy; the file's weights dequantized "
                           "to F32 (native_*: the quantized file as it is)", "cases": cases}
        dest = fixtures / "generate.json"          # the other models' entries are kept
        docs = json.loads(dest.read_text()) if dest.exists() else {}
        docs[key] = doc
        dest.write_text(json.dumps(docs, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
