"""Constrained decoding: a request's grammar (response_format json_object / json_schema,
llama-server's `grammar` in Lark or GBNF, a `regex`) compiled by llguidance into a matcher that
masks the logits before every draw and advances with every sampled token.

The mask is applied on the host, where the server samples: the step's logits reach the host
before sampling on the GPU too, so one mask path serves both devices. A grammar that is complete
ends its request ("stop"); the end-of-generation tokens are allowed only where the grammar may end.
"""
import json
import threading

import numpy as np

from lite.server.openai_protocol import RequestError
from lite.files.vocab import A_CONTROL

# JSON as people write it on one line: ", " and ": " between items and no other whitespace, so a
# small model cannot wander into endless newlines between tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_LOCK = threading.Lock()


def load_llguidance():
    try:
        import llguidance
    except ImportError:
        raise RequestError(400, "constrained decoding needs llguidance: pip install 'lite[server]'",
                           code="grammar_unavailable") from None
    return llguidance


def llg_tokenizer(tok):
    """llguidance's view of a lite Tokenizer (built once per tokenizer): every token's bytes,
    control tokens marked special (so no grammar text can spell them), and the end-of-generation
    tokens as its end-of-sequence set."""
    with _LOCK:
        cached = getattr(tok, "_llguidance", None)
        if cached is not None:
            return cached
        llg = load_llguidance()

        class Vocab:
            eos_token_id, bos_token_id = tok.eos_id, tok.bos_id
            tokens = [(b"\xff" if a & A_CONTROL else b"") + tok.token_bytes(i)
                      for i, a in enumerate(tok.attrs)]
            special_token_ids = [i for i, a in enumerate(tok.attrs) if a & A_CONTROL]

            def __call__(self, text):
                if isinstance(text, bytes):
                    text = text.decode("utf-8", "replace")
                return tok.encode(text, add_special=False, parse_special=False)

        eos = sorted(tok.eog_ids) or ([tok.eos_id] if tok.eos_id is not None else None)
        tok._llguidance = llg.LLTokenizer(llg.TokenizerWrapper(Vocab()), eos_token=eos)
        return tok._llguidance


def closed_objects(schema):
    """A copy of a JSON schema where every object that lists properties and says nothing of
    additionalProperties admits no others (OpenAI's strict mode): what it accepts still validates
    against the schema as given."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_objects(v) for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def json_grammar(schema, param):
    """The llguidance grammar of JSON following `schema` (a dict); errors name `param`."""
    try:
        return load_llguidance().LLMatcher.grammar_from_json_schema(closed_objects(schema),
                                                                    overrides=JSON_OPTIONS)
    except ValueError as e:
        raise RequestError(400, f"invalid '{param}': {e}", param=param,
                           code="invalid_grammar") from None


def lark_json(schema):
    """A Lark rule body for JSON following `schema`, for grammars that embed it."""
    return "%json " + json.dumps({**closed_objects(schema), "x-guidance": JSON_OPTIONS})


def request_grammar(body):
    """The grammar a request asks for -> (llguidance grammar text, the field named in errors), or
    (None, None). Reads response_format (OpenAI), and llama-server's grammar / json_schema fields,
    plus regex."""
    asked = [k for k in ("response_format", "grammar", "json_schema", "regex")
             if body.get(k) is not None]
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "text":
        asked.remove("response_format")
    if not asked:
        return None, None
    if len(asked) > 1:
        raise RequestError(400, f"give one of {', '.join(asked)}, not several", param=asked[1])
    param = asked[0]
    llg = load_llguidance()
    value = body[param]
    if param == "response_format":
        return _response_format(value), param
    if param == "json_schema":
        if not isinstance(value, dict):
            raise RequestError(400, "'json_schema' must be a JSON schema object", param=param)
        return json_grammar(value, param), param
    if not isinstance(value, str) or not value.strip():
        raise RequestError(400, f"'{param}' must be a non-empty string", param=param)
    if param == "regex":
        return llg.LLMatcher.grammar_from_regex(value), param
    try:        # Lark, or GBNF (llama.cpp's) converted to Lark
        return llg.grammar_from("grammar", value), param
    except ValueError as e:
        raise RequestError(400, f"'grammar' is neither Lark nor GBNF: {e}", param=param) from None


def _response_format(rf):
    param = "response_format"
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise RequestError(400, "'response_format' must be an object with a 'type'", param=param)
    if rf["type"] == "json_object":
        return json_grammar({"type": "object"}, param)
    if rf["type"] != "json_schema":
        raise RequestError(400, f"response_format type {rf['type']!r} is not supported "
                                "(text, json_object or json_schema)", param=param)
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise RequestError(400, "response_format.json_schema must be an object whose 'schema' is "
                                "a JSON schema object", param=param)
    return json_grammar(spec.get("schema", {}), param)


class Constraint:
    """One request's matcher: mask(logits) before a draw, advance(token) after it."""

    def __init__(self, matcher, n_vocab):
        self.matcher, self.n_vocab = matcher, n_vocab

    def mask(self, logits):
        """A copy of the logits with every token the grammar forbids at -inf."""
        logits = np.asarray(logits, dtype=np.float32)
        bits = np.frombuffer(self.matcher.compute_bitmask(), np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[:self.n_vocab].astype(bool)
        if allowed.size < logits.size:        # output rows past the vocabulary: never drawn
            allowed = np.pad(allowed, (0, logits.size - allowed.size))
        return np.where(allowed[:logits.size], logits, np.float32(-np.inf))

    def advance(self, token):
        """Feed the drawn token; False (with .error) if the grammar refused it."""
        return self.matcher.consume_token(int(token))

    @property
    def error(self):
        return self.matcher.get_error()

    @property
    def done(self):
        """The grammar is complete and takes nothing more."""
        return self.matcher.is_stopped()


def make_constraint(tok, grammar, param):
    """A Constraint for `grammar` on tokenizer `tok`; a grammar llguidance refuses is a 400 naming
    `param`. Slow for big grammars: call it off the event loop."""
    llg = load_llguidance()
    lt = llg_tokenizer(tok)
    err = llg.LLMatcher.validate_grammar(grammar, lt)
    if err:
        raise RequestError(400, f"invalid '{param}': {err.strip().splitlines()[0]}", param=param,
                           code="invalid_grammar")
    matcher = llg.LLMatcher(lt, grammar, log_level=0)
    if matcher.is_error():
        raise RequestError(400, f"invalid '{param}': {matcher.get_error()}", param=param,
                           code="invalid_grammar")
    return Constraint(matcher, lt.vocab_size)



def completion_constraint(body, tok):
    """The Constraint a completion request asks for, or None. Run it off the event loop."""
    text, param = request_grammar(body)
    return make_constraint(tok, text, param) if text is not None else None
