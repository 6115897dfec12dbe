"""Tokenizer built from GGUF metadata, reproducing llama.cpp's llama-vocab.cpp token for token.

Two models: byte-level BPE (`tokenizer.ggml.model == "gpt2"`, with the pre-tokenizer regexes that
`tokenizer.ggml.pre` names) and SentencePiece-style (`"llama"`: score-ordered bigram merges with
<0xXX> byte fallback). Special tokens (CONTROL / USER_DEFINED) are cut out of the text first, the
way llama.cpp's tokenizer_st_partition does. Text is Python str; pieces are bytes.
"""
import codecs
import logging

import regex

from lite.errors import ConfigError
from lite.files.pretokenizer import BYTE_DEC, PreTokenizer, byte_encode
from lite.files.vocab import (A_BYTE, A_CONTROL, A_LSTRIP, A_NORMAL, A_RSTRIP, A_UNKNOWN, A_UNUSED, A_USER,
                              EOG_TEXTS, EOT_TEXTS, FIM_TEXTS, TYPE_ATTR, merge)

log = logging.getLogger(__name__)

_WS = " \t\n\v\f\r"


class Tokenizer:
    """llama.cpp-compatible tokenizer. Build with `Tokenizer.from_metadata(gguf_metadata)`."""

    def __init__(self, model, tokens, token_types=None, scores=None, merges=None, pre="default",
                 bos_id=None, eos_id=None, add_bos=None, add_eos=False, add_space_prefix=None,
                 special_ids=None, chat_template=None, architecture="", name=""):
        if model not in ("gpt2", "llama"):
            raise ConfigError(f"tokenizer model {model!r} is not supported (only 'gpt2' BPE "
                              "and 'llama' SentencePiece)")
        self.model, self.architecture, self.chat_template = model, architecture, chat_template
        # llama.cpp renames empty token texts so that every text maps back to one id
        self.tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.n_vocab = len(self.tokens)
        self.scores = [float(s) for s in scores] if scores is not None else [0.0] * self.n_vocab
        types = token_types if token_types is not None else [1] * self.n_vocab
        self.attrs = [TYPE_ATTR.get(int(t), 0) for t in types]
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        special_ids = dict(special_ids or {})
        self._clean_spaces = self._ignore_merges = False
        if model == "gpt2":
            self._setup_bpe(pre, merges)
            default_bos = self._pre.add_bos
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
        self._pre = PreTokenizer(pre)
        self.pre = self._pre.name
        self._clean_spaces, self._ignore_merges = self._pre.clean_spaces, self._pre.ignore_merges
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

        self.eot_id = given_or_found("eot", EOT_TEXTS)
        self.eom_id = given_or_found("eom", ["<|eom_id|>"])
        mark_control(self.eot_id)
        mark_control(self.eom_id)
        eog = set()
        for key, texts in FIM_TEXTS.items():
            tid = given_or_found(key, texts)
            mark_control(tid)
            if tid is not None:
                eog.add(tid)
        for tid, attr in enumerate(self.attrs):
            if attr & A_CONTROL and "unused" in self.tokens[tid]:
                self.attrs[tid] |= A_UNUSED
        for text in EOG_TEXTS & self.vocab.keys():
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
        if "phi-3" in name.lower() or "phi3" in name.lower():  # llama.cpp's per-model override
            for i in special + [self.vocab[t] for t in ("</s>",) if t in self.vocab]:
                self.attrs[i] |= A_RSTRIP
            for i in (self.vocab[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in self.vocab):
                self.attrs[i] &= ~A_RSTRIP
        # longest first, as llama.cpp sorts its special-token cache
        special.sort(key=lambda i: -len(self.tokens[i].encode("utf-8")))
        self._special = [(i, self.tokens[i]) for i in special if self.tokens[i]]

    # ---- encode ----
    def encode(self, text, add_special=True, parse_special=True):
        """Token ids of `text`, as llama_tokenize(text, add_special, parse_special). `text` may also
        be a list of (text, parse_special) spans, tokenized as their joined text would be except
        that special-token spellings are cut out only where a span says so."""
        spans = [(text, parse_special)] if isinstance(text, str) else text
        frags = self._fragments(spans)
        out = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise ConfigError("the model asks for a BOS token but defines none")
            out.append(self.bos_id)
        prev_special = True
        for frag in frags:
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

    def _fragments(self, spans):
        """The str and int fragments of (text, parse_special) spans: texts that meet are joined, and
        whitespace beside an LSTRIP/RSTRIP special is stripped across spans as within one."""
        frags = []
        for text, parse_special in spans:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates (e.g. from JSON) cannot be UTF-8: U+FFFD
                text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
            for frag in self._partition(text, parse_special):
                prev = frags[-1] if frags else None
                if isinstance(frag, str) and isinstance(prev, str):
                    frags[-1] = prev + frag
                    continue
                if isinstance(frag, str) and prev is not None and self.attrs[prev] & A_RSTRIP:
                    frag = frag.lstrip(_WS)
                elif isinstance(frag, int) and isinstance(prev, str) and self.attrs[frag] & A_LSTRIP:
                    frags[-1] = prev.rstrip(_WS)
                frags.append(frag)
        return [f for f in frags if f != ""]

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
                        part = part.lstrip(_WS)
                    if k < len(parts) - 1 and attr & A_LSTRIP:
                        part = part.rstrip(_WS)
                    if part:
                        new.append(part)
            frags = new
        return frags

    def _encode_bpe(self, text, out):
        cache = self._bpe_cache
        if len(cache) > 100_000:
            cache.clear()
        for word in self._pre.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = cache[word] = self._bpe_word(byte_encode(word))
            out.extend(ids)

    def _bpe_word(self, word):
        """Lowest-rank merge first, leftmost on ties (as llama.cpp's BPE tokenizer does)."""
        vocab, ranks = self.vocab, self._ranks
        if self._ignore_merges and word in vocab:
            return [vocab[word]]
        ids = []
        for s in merge(list(word), lambda a, b: ranks.get((a, b))):
            tid = vocab.get(s)
            if tid is not None:
                ids.append(tid)
            else:  # llama.cpp falls back to one-byte token texts; multi-byte code units never match
                ids.extend(vocab[chr(b)] for b in s.encode("utf-8") if b < 128 and chr(b) in vocab)
        return ids

    def _encode_spm(self, text, out):
        """Highest-score bigram first, leftmost on ties (as llama.cpp's SPM tokenizer does)."""
        vocab, scores = self.vocab, self.scores

        def priority(a, b):
            tid = vocab.get(a + b)
            return None if tid is None else -scores[tid]
        for s in merge(list(text), priority):
            tid = vocab.get(s)
            if tid is not None:
                out.append(tid)
                continue
            for b in s.encode("utf-8"):
                tid = vocab.get(f"<0x{b:02X}>")
                if tid is None and b < 128:  # a vocabulary that spells ASCII bytes plainly
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
                return bytes(BYTE_DEC[c] for c in text)
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

    def spells_control(self, text):
        """Whether parsing special tokens would find a control token in `text`."""
        return self._partition(text, True) != self._partition(text, False)

    def apply_chat_template(self, messages, add_generation_prompt=True, template=None, **extra):
        """The conversation's text (what encode_chat tokenizes, with the markup's specials)."""
        return "".join(t for t, _ in self.chat_spans(messages, add_generation_prompt, template,
                                                      whole=True, **extra))

    def encode_chat(self, messages, add_generation_prompt=True, template=None, **extra):
        """Token ids of a conversation: the template's markup makes control tokens, the messages'
        contents never do (a user's "<|im_end|>" stays text and cannot end the turn)."""
        return self.encode(self.chat_spans(messages, add_generation_prompt, template, **extra))

    def chat_spans(self, messages, add_generation_prompt=True, template=None, whole=False, **extra):
        """`messages` rendered with the file's chat template (or a built-in one by architecture) as
        (text, parse_special) spans for encode(): lite.files.chat_template.chat_spans. A leading BOS
        spelling is removed when encode() adds BOS itself, as llama.cpp's common chat code does,
        so that the ids start with exactly one BOS."""
        from lite.files.chat_template import builtin_template, chat_spans
        tmpl = template or self.chat_template or builtin_template(self.architecture)
        bos = self.tokens[self.bos_id] if self.bos_id is not None else ""
        eos = self.tokens[self.eos_id] if self.eos_id is not None else ""
        spans = chat_spans(tmpl, messages, add_generation_prompt, self.spells_control, whole,
                           bos_token=bos, eos_token=eos, **extra)
        if self.add_bos and bos and spans and spans[0][1] and spans[0][0].startswith(bos):
            spans[0] = (spans[0][0][len(bos):], True)
        return spans

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
