"""Make the generation fixtures from llama.cpp (the independent reference), through llama-cpp-python.

Run with a Python that has llama-cpp-python (it builds llama.cpp from source from the package
registry) and the two models fetched by lite (`lite.hub.model_path`), e.g.:
    python -m venv /tmp/llvenv && /tmp/llvenv/bin/pip install llama-cpp-python jinja2
    /tmp/llvenv/bin/python tests/make_generation_fixtures.py ~/.cache/lite/models
Writes tests/fixtures/generate_<model>.json: for each prompt the text, the prompt token ids as
llama.cpp tokenizes them, the greedy continuation, and the top-5 logits at the last prompt position.
Chat prompts are rendered from the file's own chat template with Jinja2 (as llama-cpp-python does).
"""
import json
import sys
from pathlib import Path

import jinja2
import llama_cpp
import numpy as np

MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", 64),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", 16),
}
PLAIN = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
]
CHATS = [
    [{"role": "user", "content": "What is the tallest mountain in the world?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "List three primary colors."}],
]
# Gemma's file carries no chat template; this is Gemma's turn format (the same text lite renders).
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>"
                  "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}"
                  "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def render(template, messages, bos, eos):
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)


def run_model(path, n_gen):
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=2,
                          verbose=False, seed=0)
    meta = llm.metadata
    template = meta.get("tokenizer.chat_template")
    vocab = [llm.detokenize([i], special=True).decode("utf-8", "replace") for i in (llm.token_bos(), llm.token_eos())]
    cases = [{"kind": "plain", "text": t} for t in PLAIN]
    for msgs in CHATS:
        text = render(template or GEMMA_TEMPLATE, msgs, vocab[0], vocab[1])
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
        cases = run_model(models / fname, n_gen)
        doc = {"model": fname, "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
               "settings": "CPU, n_ctx 512, f16 KV cache, greedy", "cases": cases}
        (fixtures / f"generate_{key}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
