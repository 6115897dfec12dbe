"""Tokenizer built from GGUF metadata, reproducing llama.cpp's llama-vocab.cpp token for token.

Two models: byte-level BPE (`tokenizer.ggml.model == "gpt2"`, with the pre-tokenizer regexes that
`tokenizer.ggml.pre` names) and SentencePiece-style (`"llama"`: score-ordered bigram merges with
<0xXX> byte fallback). Special tokens (CONTROL / USER_DEFINED) are cut out of the text first, the
way llama.cpp's tokenizer_st_partition does. Text is Python str; pieces are bytes.
"""
import codecs
import heapq
import logging
import unicodedata

import regex

from lite.errors import ConfigError

log = logging.getLogger(__name__)

# GGUF token types -> llama.cpp token attributes (llama.h)
A_UNKNOWN, A_UNUSED, A_NORMAL, A_CONTROL, A_USER, A_BYTE = 1, 2, 4, 8, 16, 32
A_LSTRIP, A_RSTRIP = 128, 256
_TYPE_ATTR = {1: A_NORMAL, 2: A_UNKNOWN, 3: A_CONTROL, 4: A_USER, 5: A_UNUSED, 6: A_BYTE}

# Token texts llama.cpp treats as end of generation (llama_vocab::impl::load).
_EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
              "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["}
_EOT_TEXTS = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>"]
_FIM_TEXTS = {  # metadata key suffix -> texts llama.cpp recognises when the key is absent
    "fim_pad": ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    "fim_rep": ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    "fim_sep": ["<|file_sep|>"],
}

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
_PRE = {  # name -> (regexes applied in turn, clean_spaces, ignore_merges, add_bos default)
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
_ALIASES = {"llama-bpe": "llama3", "llama-v3": "llama3", "falcon3": "llama3", "pixtral": "llama3",
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


_BYTE_ENC, _BYTE_DEC = _byte_maps()
_LATIN1_TO_ENC = {b: _BYTE_ENC[b] for b in range(256)}


class Tokenizer:
    """llama.cpp-compatible tokenizer. Build with `Tokenizer.from_metadata(gguf_metadata)`."""

    def __init__(self, model, tokens, token_types=None, scores=None, merges=None, pre="default",
                 bos_id=None, eos_id=None, add_bos=None, add_eos=False, add_space_prefix=None,
                 special_ids=None, chat_template=None, architecture="", name=""):
        if model not in ("gpt2", "llama"):
            raise ConfigError(f"tokenizer model {model!r} is not supported (only 'gpt2' BPE "
                              "and 'llama' SentencePiece)")
        self.model, self.architecture, self.chat_template = model, architecture, chat_template
        self.tokens = list(tokens)
        self.n_vocab = len(self.tokens)
        self.scores = [float(s) for s in scores] if scores is not None else [0.0] * self.n_vocab
        types = token_types if token_types is not None else [1] * self.n_vocab
        self.attrs = [_TYPE_ATTR.get(int(t), 0) for t in types]
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        special_ids = dict(special_ids or {})
        self._clean_spaces = self._ignore_merges = False
        if model == "gpt2":
            self._setup_bpe(pre, merges)
            default_bos = self._pre_add_bos
            bos_default = eos_default = 11
        else:
            default_bos, bos_default, eos_default = True, 1, 2
            self.add_space_prefix = True
        if add_space_prefix is not None:
            self.add_space_prefix = bool(add_space_prefix)
        self.add_bos = default_bos if add_bos is None else bool(add_bos)
        self.add_eos = bool(add_eos)
        self.bos_id = self._valid(bos_id, bos_default)
        self.eos_id = self._valid(eos_id, eos_default)
        self._setup_special(special_ids, name)
        self._piece_cache = {}
        self._bpe_cache = {}

    def _valid(self, tid, default):
        tid = default if tid is None else int(tid)
        return tid if tid is not None and 0 <= tid < self.n_vocab else None

    @classmethod
    def from_metadata(cls, md):
        """Build from a GGUF metadata dict (GGUFFile(path).metadata)."""
        def get(key, default=None):
            return md.get("tokenizer.ggml." + key, default)
        if get("tokens") is None or get("model") is None:
            raise ConfigError("GGUF metadata has no tokenizer (tokenizer.ggml.model / .tokens)")
        special = {k: get(k + "_token_id") for k in ("eot", "eom", "fim_pad", "fim_rep", "fim_sep")}
        return cls(get("model"), get("tokens"), token_types=get("token_type"),
                   scores=get("scores"), merges=get("merges"), pre=get("pre", ""),
                   bos_id=get("bos_token_id"), eos_id=get("eos_token_id"),
                   add_bos=get("add_bos_token"), add_eos=get("add_eos_token", False),
                   add_space_prefix=get("add_space_prefix"), special_ids=special,
                   chat_template=md.get("tokenizer.chat_template"),
                   architecture=md.get("general.architecture", ""), name=md.get("general.name", ""))

    # ---- setup ----
    def _setup_bpe(self, pre, merges):
        if merges is None:
            raise ConfigError("BPE tokenizer without tokenizer.ggml.merges")
        name = _ALIASES.get(pre, pre)
        if name not in _PRE:
            log.warning("unknown pre-tokenizer %r: using llama.cpp's default regexes; "
                        "tokenization may differ from the model's own", pre)
            name = "default"
        exprs, self._clean_spaces, self._ignore_merges, self._pre_add_bos = _PRE[name]
        self.pre = name
        self._regexes = [_compile(e) for e in exprs]
        self.add_space_prefix = False
        self._ranks = {}
        for rank, m in enumerate(merges):
            pos = m.find(" ", 1)
            pair = (m[:pos], m[pos + 1:]) if pos >= 0 else ("", "")
            self._ranks.setdefault(pair, rank)

    def _setup_special(self, special_ids, name):
        def find(texts):
            return next((self.vocab[t] for t in texts if t in self.vocab), None)

        def mark_control(tid):
            if tid is not None:
                self.attrs[tid] |= A_CONTROL

        def given_or_found(key, texts):
            tid = self._valid(special_ids.get(key), None)
            return tid if tid is not None else find(texts)

        self.eot_id = given_or_found("eot", _EOT_TEXTS)
        self.eom_id = given_or_found("eom", ["<|eom_id|>"])
        mark_control(self.eot_id)
        mark_control(self.eom_id)
        eog = set()
        for key, texts in _FIM_TEXTS.items():
            tid = given_or_found(key, texts)
            mark_control(tid)
            if tid is not None:
                eog.add(tid)
        for tid, attr in enumerate(self.attrs):
            if attr & A_CONTROL and "unused" in self.tokens[tid]:
                self.attrs[tid] |= A_UNUSED
        for text in _EOG_TEXTS & self.vocab.keys():
            eog.add(self.vocab[text])
            mark_control(self.vocab[text])
        eog.update(t for t in (self.eos_id, self.eot_id, self.eom_id) if t is not None)
        texts = {self.tokens[t]: t for t in eog}
        if "<|end|>" in texts and ({"<|return|>", "<|call|>"} <= texts.keys()
                                   or {"<|calls|>", "<|flush|>"} <= texts.keys()):
            eog.discard(texts["<|end|>"])
            self.attrs[texts["<|end|>"]] = A_USER
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(texts["</s>"])
            self.attrs[texts["</s>"]] = A_NORMAL
        self.eog_ids = frozenset(eog)
        special = [i for i, a in enumerate(self.attrs) if a & (A_CONTROL | A_USER | A_UNKNOWN)]
        if "phi-3" in name.lower() or "phi3" in name.lower():
            for i in special:
                self.attrs[i] |= A_RSTRIP
        # longest first, as llama.cpp sorts its special-token cache
        special.sort(key=lambda i: -len(self.tokens[i].encode("utf-8")))
        self._special = [(i, self.tokens[i]) for i in special if self.tokens[i]]

    # ---- encode ----
    def encode(self, text, add_special=True, parse_special=True):
        """Token ids of `text`, as llama_tokenize(text, add_special, parse_special)."""
        out = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise ConfigError("the model asks for a BOS token but defines none")
            out.append(self.bos_id)
        prev_special = True
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
            elif self.model == "gpt2":
                self._encode_bpe(frag, out)
            else:
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._encode_spm(frag.replace(" ", "\u2581"), out)
                prev_special = False
        if add_special and self.add_bos and len(out) >= 2 and out[1] == self.bos_id:
            log.debug("prompt starts with two BOS tokens (the text spelled one out)")
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _partition(self, text, parse_special):
        """Split text around special-token spellings (tokenizer_st_partition): str or int items."""
        frags = [text] if text else []
        for tid, spelling in self._special:
            attr = self.attrs[tid]
            if (not parse_special and attr & (A_CONTROL | A_UNKNOWN)) or spelling not in text:
                continue
            new = []
            for frag in frags:
                if isinstance(frag, int) or spelling not in frag:
                    new.append(frag)
                    continue
                parts = frag.split(spelling)
                for k, part in enumerate(parts):
                    if k:
                        new.append(tid)
                    if k and attr & A_RSTRIP:
                        part = part.lstrip(" \t\n\v\f\r")
                    if k < len(parts) - 1 and attr & A_LSTRIP:
                        part = part.rstrip(" \t\n\v\f\r")
                    if part:
                        new.append(part)
            frags = new
        return frags

    def _pretokenize(self, text):
        """Words of `text` by llama.cpp's pre-tokenizer regexes, applied one after another."""
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

    def _encode_bpe(self, text, out):
        cache = self._bpe_cache
        if len(cache) > 100_000:
            cache.clear()
        for word in self._pretokenize(text):
            ids = cache.get(word)
            if ids is None:
                enc = word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_ENC)
                ids = cache[word] = self._bpe_word(enc)
            out.extend(ids)

    def _bpe_word(self, word):
        """Lowest-rank merge first, leftmost on ties (llm_tokenizer_bpe_session)."""
        vocab = self.vocab
        if self._ignore_merges and word in vocab:
            return [vocab[word]]
        syms, ranks = list(word), self._ranks
        n = len(syms)
        nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
        if n:
            nxt[-1] = -1
        heap = []

        def add(left, right):
            if left >= 0 and right >= 0:
                r = ranks.get((syms[left], syms[right]))
                if r is not None:
                    heapq.heappush(heap, (r, left, right, syms[left] + syms[right]))

        for i in range(n - 1):
            add(i, i + 1)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or a + b != merged:
                continue
            syms[left], syms[right] = merged, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            add(prv[left], left)
            add(left, nxt[left])
        ids = []
        for s in syms:
            if not s:
                continue
            tid = vocab.get(s)
            if tid is not None:
                ids.append(tid)
            else:  # llama.cpp falls back to one-byte token texts; multi-byte code units never match
                ids.extend(vocab[chr(b)] for b in s.encode("utf-8") if b < 128 and chr(b) in vocab)
        return ids

    def _encode_spm(self, text, out):
        """Highest-score bigram first, leftmost on ties (llm_tokenizer_spm_session)."""
        vocab, scores = self.vocab, self.scores
        syms = list(text)
        n = len(syms)
        nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
        if n:
            nxt[-1] = -1
        heap = []

        def add(left, right):
            if left >= 0 and right >= 0:
                tid = vocab.get(syms[left] + syms[right])
                if tid is not None:
                    size = len(syms[left]) + len(syms[right])
                    heapq.heappush(heap, (-scores[tid], left, right, size))

        for i in range(n - 1):
            add(i, i + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or len(a) + len(b) != size:
                continue
            syms[left], syms[right] = a + b, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            add(prv[left], left)
            add(left, nxt[left])
        for s in syms:
            if not s:
                continue
            tid = vocab.get(s)
            if tid is not None:
                out.append(tid)
                continue
            for b in s.encode("utf-8"):
                tid = vocab.get(f"<0x{b:02X}>")
                if tid is None:
                    tid = vocab.get(chr(b))
                if tid is None:
                    raise ConfigError(f"SentencePiece vocabulary has no byte token for 0x{b:02X}")
                out.append(tid)

    # ---- decode ----
    def token_bytes(self, tid, special=True):
        """The bytes token `tid` stands for (llama_token_to_piece); control tokens give b"" unless
        `special`."""
        attr = self.attrs[tid]
        if not special and attr & (A_UNKNOWN | A_CONTROL):
            return b""
        piece = self._piece_cache.get(tid)
        if piece is None:
            piece = self._piece_cache[tid] = self._piece(tid, attr)
        return piece

    def _piece(self, tid, attr):
        text = self.tokens[tid]
        if attr & (A_UNKNOWN | A_CONTROL | A_USER):
            return text.encode("utf-8")
        if attr & A_NORMAL:
            if self.model == "llama":
                return text.replace("\u2581", " ").encode("utf-8")
            try:
                return bytes(_BYTE_DEC[c] for c in text)
            except KeyError:
                return text.encode("utf-8")
        if attr & A_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def decode_bytes(self, ids, special=False):
        """llama_detokenize(ids, remove_special=False, unparse_special=special), as bytes."""
        parts = [self.token_bytes(int(t), special) for t in ids]
        if parts and self.add_space_prefix and parts[0].startswith(b" "):
            parts[0] = parts[0][1:]
        data = b"".join(parts)
        return _clean_spaces(data) if self._clean_spaces else data

    def decode(self, ids, special=False):
        """Text of `ids`; invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def decoder(self, special=False):
        """A StreamDecoder for this tokenizer."""
        return StreamDecoder(self, special)

    def is_eog(self, tid):
        return tid in self.eog_ids

    def apply_chat_template(self, messages, add_generation_prompt=True, template=None, **extra):
        """Render `messages` with the file's chat template (or a built-in one by architecture).
        A leading BOS spelling is removed when encode() adds BOS itself, as llama.cpp's common
        chat code does, so that encode(text) starts with exactly one BOS."""
        from lite.chat_template import builtin_template, render_chat
        tmpl = template or self.chat_template or builtin_template(self.architecture)
        bos = self.tokens[self.bos_id] if self.bos_id is not None else ""
        eos = self.tokens[self.eos_id] if self.eos_id is not None else ""
        text = render_chat(tmpl, messages, add_generation_prompt, bos_token=bos, eos_token=eos,
                           **extra)
        if self.add_bos and bos and text.startswith(bos):
            text = text[len(bos):]
        return text

    def __repr__(self):
        return (f"Tokenizer({self.model}, n_vocab={self.n_vocab}, bos={self.bos_id}, "
                f"eos={self.eos_id}, eog={sorted(self.eog_ids)})")


def _clean_spaces(b):
    """llama_detokenize's clean_up_tokenization_spaces passes."""
    b = b.replace(b" ?", b"?").replace(b" !", b"!").replace(b" .", b".").replace(b" ,", b",")
    b = regex.sub(rb" ' ", b"'", b)
    return regex.sub(rb" '(?=[sm]|re|ve)", b"'", b)


class StreamDecoder:
    """Feed ids one at a time; `push(id)` returns the text completed so far at UTF-8 boundaries."""

    def __init__(self, tok, special=False):
        self._tok, self._special, self._first = tok, special, True
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, tid):
        piece = self._tok.token_bytes(int(tid), self._special)
        if self._first:
            if self._tok.add_space_prefix and piece.startswith(b" "):
                piece = piece[1:]
            self._first = False
        return self._dec.decode(piece)

    def flush(self):
        """Text held back for an incomplete UTF-8 sequence at the end (as U+FFFD)."""
        return self._dec.decode(b"", final=True)
