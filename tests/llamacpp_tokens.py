"""llama.cpp's tokenizer and chat renderings through llama-cpp-python, for tests/make_llamacpp_fixtures.py:
the strings the tokens command records (tests/fixtures/tokens.json) and the record of one model, and
llama.cpp's built-in chat rendering (the generation command's too). Needs llama-cpp-python (the
script's docstring says how to get it); imported only by that script."""
import ctypes
import os


def builtin_chat(llama_cpp, name, messages):
    """llama.cpp's own hard-coded rendering of a named template (llama_chat_apply_template): what it
    renders for a file without a chat template."""
    arr = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode())
          for m in messages])
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), True, buf, len(buf))
    assert 0 < n < len(buf), n
    return buf.raw[:n].decode("utf-8")


_PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs! "
    "In 1969, Apollo 11 landed on the Moon; 600,000,000 people watched. It's 3:45pm — isn't it? "
    "We'll see what they've done. “Smart quotes” and ‘single ones’… and an em—dash. "
) * 4

STRINGS = [
    "",
    " ",
    "   ",
    "Hello world",
    " Hello world",
    "hello  world",
    "Hello, World! How are you today?",
    "trailing space ",
    "\n",
    "\n\n\n",
    "line one\nline two\n\nline four",
    "\r\n windows \r\n line",
    "\ttab\t\tdouble tab",
    "a \t b \n c",
    "                    twenty spaces",
    "1234567890",
    "3.14159 2.71828 -42 +7",
    "12345678901234567890123456789",
    "Phone: +1 (555) 123-4567, ZIP 90210",
    "I'm sure you'll see they've done it, he'd say; it's ours. DON'T SHOUT",
    "café naïve résumé façade Ñandú Øresund",
    "e\u0301 combining accent and \u00a0non-breaking\u2009thin space",
    "Grüße aus München! Ελληνικά κείμενα. Русский текст.",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "مرحبا بالعالم، كيف حالك؟",
    "עברית מימין לשמאל",
    "नमस्ते दुनिया",
    "Emoji: 👋🌍🤖🧠 🇫🇷 👩‍👩‍👧‍👦 ❤️",
    "mixed 中文 and English and 123 数字",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "<html><body><table><tr><td>cell</td></tr></table></body></html>",
    "https://example.com/path?query=1&other=two#frag",
    "!!!???...,,,;;;:::---___",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after eot",
    "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>starts with bos spelling",
    "<eos> and <pad> and <unk> and <unused0> inline",
    "<|im_start|><|im_start|>double",
    "text<end_of_turn>",
    "  <start_of_turn>  spaced  ",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n many newlines",
    "\u200bzero\u200bwidth\ufeffbom",
    "\x01\x02 control chars \x1f\x7f",
    "½ ² ⅷ ① numerals",
    "$100 + €50 = £120 ≈ ¥17000 ± 5%",
    "<s>html strike</s> and </s> alone",
    " <|im_end|> spaced eot",
    "IT'S THEY'LL we'D can'T a'b 'quoted'",
    "ideographic\u3000space and\u2028line separator",
    "new emoji 🫨🪿 and rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "Ǆ ǅ ǆ titlecase and ﬁ ligature",
    _PARAGRAPH,
]

CHAT_MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]

CHAT_MULTI_TURN = [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": " Hi! "},
    {"role": "assistant", "content": "Hello.\n"},
    {"role": "user", "content": "Name a colour."},
]


def _detokenize(llama_cpp, vocab, ids, remove_special, unparse_special):
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special,
                                       unparse_special)
        if n >= 0:
            return buf.raw[:n]
        size = -n + 16


def _piece(llama_cpp, vocab, tok, special):
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, tok, buf, 256, 0, special)
    assert n >= 0, (tok, n)
    return buf.raw[:n]


def make_tokens(name, path):
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    cases, seen = [], set()
    for text in STRINGS:
        case = {"text": text}
        for key, special in (("ids", True), ("ids_plain", False)):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)
            case[key] = ids
            seen.update(ids)
        # llama.cpp's own detokenize (not llama-cpp-python's, which strips a space after BOS)
        case["decoded"] = _detokenize(llama_cpp, vocab, case["ids_plain"], False, False).decode(
            "utf-8", errors="replace")
        case["decoded_special"] = _detokenize(llama_cpp, vocab, case["ids"], False, True).decode(
            "utf-8", errors="replace")
        cases.append(case)

    pieces = {str(t): _piece(llama_cpp, vocab, t, True).hex() for t in sorted(seen)}
    eog = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]

    out = {
        "model": os.path.basename(path),
        "llama_cpp_python": llama_cpp.__version__,
        "n_vocab": n_vocab,
        "bos_id": llama_cpp.llama_vocab_bos(vocab),
        "eos_id": llama_cpp.llama_vocab_eos(vocab),
        "eog_ids": eog,
        "cases": cases,
        "pieces_hex": pieces,
    }
    builtin = "gemma" if "gemma" in name else "chatml"
    out["chat_builtin"] = {"template": builtin, "conversations": [
        {"messages": msgs, "rendered": builtin_chat(llama_cpp, builtin, msgs)}
        for msgs in (CHAT_MESSAGES, CHAT_MULTI_TURN)]}
    template = llm.metadata.get("tokenizer.chat_template")
    if template:
        bos = _piece(llama_cpp, vocab, out["bos_id"], True).decode()
        eos = _piece(llama_cpp, vocab, out["eos_id"], True).decode()
        fmt = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos,
                                  add_generation_prompt=True)
        out["chat"] = {
            "messages": CHAT_MESSAGES,
            "bos_token": bos,
            "eos_token": eos,
            "rendered": fmt(messages=CHAT_MESSAGES).prompt,
        }
    return out
