"""BPE pre-tokenization as llama.cpp does it (llm_tokenizer_bpe, unicode_regex_split): the regexes
`tokenizer.ggml.pre` names, run over a "collapsed" copy of the text where each non-ASCII code point
stands for its Unicode category, plus GPT-2's byte <-> printable-character mapping.
"""
import logging
import unicodedata

import regex

log = logging.getLogger(__name__)

# ---- pre-tokenizer regexes (llm_tokenizer_bpe in llama-vocab.cpp) ----
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTR = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3 = _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _TAIL
_QWEN2 = _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL
_QWEN35 = (_CONTR + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPLOW = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+@C@|[^\r\n\p{L}\p{N}]?"
          r"((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*@C@|@N@| ?[^\s\p{L}\p{N}]+[\r\n/]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
PRESETS = {  # name -> (regexes applied in turn, clean_spaces, ignore_merges, add_bos default)
    "default": ([r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"], True, False, False),
    "llama3": ([_LLAMA3], True, True, True),
    "dbrx": ([_LLAMA3], True, False, False),
    "deepseek-llm": (["[\r\n]", r"\s?[" + _DEEPSEEK_LLM_LETTERS + "]+",
                      "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                      r"\s+$", _CJK, r"\p{N}+"], False, False, False),
    "deepseek-coder": (["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"], False, False, False),
    "deepseek-v3": ([r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
                     r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?"
                     r"[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
                    False, False, False),
    "falcon": ([r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"], True, False, False),
    "starcoder": ([r"\p{N}", _GPT2], True, False, False),
    "smollm": ([r"\p{N}", _GPT2], False, False, False),
    "command-r": ([r"\p{N}", _GPT2], False, False, False),
    "gpt-2": ([_GPT2], True, False, False),
    "qwen2": ([_QWEN2], False, False, False),
    "stablelm2": ([_QWEN2], True, False, False),
    "qwen35": ([_QWEN35], False, False, False),
    "tekken": ([_UPLOW.replace("@C@", "").replace("@N@", r"\p{N}")], False, True, True),
    "gpt-4o": ([_UPLOW.replace("@C@", "(?:" + _CONTR + ")?").replace(
        "@N@", r"\p{N}{1,3}")], False, False, False),
    "bloom": ([r" ?[^(\s|.,!?…。，、।۔،)]+"], True, False, False),
    "poro-chat": ([r" ?[^(\s|.,!?…。，、।۔،)]+"], False, False, False),
    "viking": ([r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"], False, False, False),
}
ALIASES = {"llama-bpe": "llama3", "llama-v3": "llama3", "falcon3": "llama3", "pixtral": "llama3",
            "smaug-bpe": "dbrx", "refact": "starcoder", "codeshell": "starcoder",
            "exaone": "starcoder", "minerva-7b": "starcoder", "mpt": "gpt-2", "olmo": "gpt-2",
            "phi-2": "gpt-2", "jais": "gpt-2", "trillion": "gpt-2", "exaone4": "gpt-2",
            "deepseek-r1-qwen": "qwen2", "megrez": "qwen2", "hunyuan": "qwen2",
            "llama4": "gpt-4o", "gpt3-finnish": "bloom"}

# ---- unicode handling that mirrors unicode.cpp ----
_SPACE = "\\t\\n\\x0b\\x0c\\r "  # what llama.cpp's \s matches once non-ASCII spaces are collapsed
_WS_NON_ASCII = {0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000}
_CAT_CODE = {"N": 0xD1, "L": 0xD2, "P": 0xD3, "M": 0xD4, "S": 0xD5}


def _ascii_of(cat):
    chars = (chr(c) for c in range(128))
    return "".join(regex.escape(c) for c in chars if unicodedata.category(c)[0] == cat)


_CAT_CLASS = {k: chr(v) + _ascii_of(k) for k, v in _CAT_CODE.items()}


class _Collapse(dict):
    """str.translate table: each non-ASCII code point -> one stand-in per category (unicode.cpp)."""

    def __missing__(self, cp):
        if cp < 128:
            v = cp
        elif cp in _WS_NON_ASCII:
            v = 0x0B
        else:
            v = _CAT_CODE.get(unicodedata.category(chr(cp))[0], 0xD0)
        self[cp] = v
        return v


class _SpaceOnly(dict):
    """Translate table for regexes without categories: only non-ASCII spaces become \\x0b."""

    def __missing__(self, cp):
        v = 0x0B if cp in _WS_NON_ASCII else cp
        self[cp] = v
        return v


_COLLAPSE, _SPACE_ONLY = _Collapse(), _SpaceOnly()


def _compile(expr):
    """Rewrite a llama.cpp pre-tokenizer regex for the collapsed text, as unicode_regex_split does;
    returns (compiled, uses_categories)."""
    collapsed = r"\p{" in expr
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "\\" and i + 1 < len(expr):
            n = expr[i + 1]
            if n == "p" and collapsed:
                j = expr.index("}", i)
                body = _CAT_CLASS[expr[i + 3]]
                out.append(body if inside else "[" + body + "]")
                i = j + 1
                continue
            if n in "sS":
                neg = "^" if n == "S" else ""
                out.append(_SPACE if inside and not neg else "[" + neg + _SPACE + "]")
                i += 2
                continue
            out.append(expr[i:i + 2])
            i += 2
            continue
        if c == "[":
            inside = True
        elif c == "]" and inside:
            inside = False
        elif c == "$" and not inside:
            c = r"\Z"  # ECMAScript $ (no multiline) is end of input only
        out.append(c)
        i += 1
    return regex.compile("".join(out), regex.V0), collapsed


def _byte_maps():
    """GPT-2's reversible byte -> printable code point table (unicode_byte_to_utf8_map)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table, {v: k for k, v in table.items()}


BYTE_ENC, BYTE_DEC = _byte_maps()
_LATIN1_TO_ENC = {b: BYTE_ENC[b] for b in range(256)}


class PreTokenizer:
    """Splits text into the words BPE merges within, for one `tokenizer.ggml.pre` name."""

    def __init__(self, pre):
        name = ALIASES.get(pre, pre)
        if name not in PRESETS:
            log.warning("unknown pre-tokenizer %r: using llama.cpp's default regexes; "
                        "tokenization may differ from the model's own", pre)
            name = "default"
        self.name = name
        exprs, self.clean_spaces, self.ignore_merges, self.add_bos = PRESETS[name]
        self._regexes = [_compile(e) for e in exprs]

    def split(self, text):
        """Words of `text`, each regex splitting the pieces the previous one left; the text between
        matches is kept as pieces too, so the words always join back to `text`."""
        spans = [(0, len(text))]
        views = {}
        for rx, collapsed in self._regexes:
            if collapsed not in views:
                views[collapsed] = text.translate(_COLLAPSE if collapsed else _SPACE_ONLY)
            view, out = views[collapsed], []
            for s, e in spans:
                pos = s
                for m in rx.finditer(view, s, e):
                    a, b = m.span()
                    if a > pos:
                        out.append((pos, a))
                    if b > a:
                        out.append((a, b))
                    pos = b
                if pos < e:
                    out.append((pos, e))
            spans = out
        return [text[s:e] for s, e in spans]


def byte_encode(word):
    """`word`'s UTF-8 bytes as GPT-2's printable stand-in characters, as BPE vocabularies spell."""
    return word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_ENC)
