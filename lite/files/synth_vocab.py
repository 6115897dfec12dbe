"""The tokenizer of a synth file (lite/files/synth.py): a gpt2-style byte-level BPE whose merges build
real-looking word pieces, with Llama 3's or Qwen 3's special tokens and chat template, as llama.cpp's
converter writes them. This module imports nothing from lite.files.synth, so lite.files.synth can
import it."""
from gguf import TokenType

from lite.errors import SynthError

def byte_chars() -> list:
    """The 256 byte tokens as GPT-2's byte-to-unicode characters, in GPT-2's vocabulary order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = [chr(b) for b in bs]
    extra = [b for b in range(256) if b not in bs]
    return cs + [chr(256 + i) for i in range(len(extra))]


_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
_LETTERS += _LETTERS.upper()
_LLAMA3_SPECIAL = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>",
                   7: "<|end_header_id|>", 9: "<|eot_id|>"}
_QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                 "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
                 "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
                 "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                 "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                 "<think>", "</think>"]
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}")


def text_tokens(n_text) -> tuple:
    """(tokens, merges): the 256 byte tokens, then tokens built by BPE merges up to n_text in all.

    Each new token is an earlier token extended by one letter (first 'Ġ' + letter, then every letter
    pair, then triples...), so both halves of every merge are tokens and ranks follow creation order:
    real-looking word pieces ("Ġth", "he") that a byte-level BPE can reach from plain text.
    """
    tokens = byte_chars()
    if n_text < len(tokens):
        raise SynthError(f"a byte-level BPE needs at least 256 ordinary tokens, got {n_text}")
    seen, merges = set(tokens), []
    lefts, i = ["Ġ"] + list(_LETTERS), 0
    while len(tokens) < n_text:
        left = lefts[i]
        i += 1
        for c in _LETTERS:
            t = left + c
            if t in seen:
                continue
            seen.add(t)
            tokens.append(t)
            merges.append(f"{left} {c}")
            lefts.append(t)
            if len(tokens) == n_text:
                break
    return tokens, merges


def vocab(arch, p) -> dict:
    """Tokenizer metadata for `arch` as llama.cpp's converter writes it (Llama 3 / Qwen 3 instruct)."""
    tokens, merges = text_tokens(p.n_text)
    types = [TokenType.NORMAL] * len(tokens)
    n_special = p.n_vocab - p.n_text
    if arch == "llama":
        reserved = iter(range(n_special))
        for i in range(n_special):
            tokens.append(_LLAMA3_SPECIAL.get(i) or f"<|reserved_special_token_{next(reserved)}|>")
            types.append(TokenType.CONTROL)
        return dict(pre="llama-bpe", tokens=tokens, types=types, merges=merges, bos=p.n_text,
                    eos=p.n_text + 9, add_bos=True, pad=None, template=LLAMA3_TEMPLATE)
    if n_special < len(_QWEN_SPECIAL):
        raise SynthError(f"qwen vocab needs {len(_QWEN_SPECIAL)} special tokens, preset leaves {n_special}")
    for t in _QWEN_SPECIAL:
        tokens.append(t)
        # the converter marks added tokens CONTROL when they look like <|...|>, else USER_DEFINED
        types.append(TokenType.CONTROL if t.startswith("<|") else TokenType.USER_DEFINED)
    for i in range(len(tokens), p.n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(TokenType.UNUSED)
    return dict(pre="qwen2", tokens=tokens, types=types, merges=merges, bos=p.n_text,
                eos=p.n_text + 2, add_bos=False, pad=p.n_text, template=CHATML_TEMPLATE)
