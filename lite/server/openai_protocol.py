"""The OpenAI API's shapes: request fields checked and turned into GenParams, and the JSON of
responses, stream chunks and errors ({"error": {"message", "type", "param", "code"}})."""
import json
import math
import time
import uuid

from lite.engine.sampling import SamplingParams
from lite.engine.sequence import GenParams

MAX_STOPS = 16
MAX_STOP_CHARS = 1024
MAX_SEED = 2 ** 64 - 1                      # seeds are None, -1 (a random one) or 0..2^64-1
IGNORED_PENALTIES = ("frequency_penalty", "presence_penalty")


class RequestError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's error fields. close: the
    connection closes after the answer (a body left unread)."""

    def __init__(self, status, message, type="invalid_request_error", param=None, code=None,
                 close=False, **extra):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.close, self.extra = close, extra

    def body(self):
        err = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        err.update(self.extra)
        return {"error": err}


def parse_json(raw):
    """The body as a JSON object. NaN and Infinity parse (as Python's json does), so that the
    field holding one is named by its own check."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise RequestError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return body


def _number(body, key, lo=None, hi=None, integer=False, lo_open=False):
    v = body.get(key)
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        raise RequestError(400, f"'{key}' must be {'an integer' if integer else 'a number'}, got {v!r}",
                           param=key)
    if not math.isfinite(v):
        raise RequestError(400, f"'{key}' must be a finite number, got {v}", param=key)
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        span = f"{'(' if lo_open else '['}{lo}, {hi if hi is not None else 'inf'}]"
        raise RequestError(400, f"'{key}' must be in {span}, got {v}", param=key)
    return v


def _typed(body, key, types, what):
    v = body.get(key)
    if v is not None and (not isinstance(v, types) or (bool not in types and isinstance(v, bool))):
        raise RequestError(400, f"'{key}' must be {what}, got {type(v).__name__}", param=key)
    return v


def model_field(body):
    return _typed(body, "model", (str,), "a string")


def gen_params(body):
    """The generation fields of a chat or completion request -> (GenParams, stream, include_usage)."""
    n = _number(body, "n", 1, integer=True)
    if n not in (None, 1):
        raise RequestError(400, "only n=1 is supported", param="n")
    max_tokens = _number(body, "max_completion_tokens", 1, integer=True)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", 1, integer=True)
    seed = _number(body, "seed", -1, MAX_SEED, integer=True)
    sampling = {k: v for k, v in (
        ("temperature", _number(body, "temperature", 0, 2)),
        ("top_p", _number(body, "top_p", 0, 1, lo_open=True)),
        ("top_k", _number(body, "top_k", 0, integer=True)),
        ("min_p", _number(body, "min_p", 0, 1)),
        ("repeat_penalty", _number(body, "repeat_penalty", 0, lo_open=True)),
        ("seed", seed)) if v is not None}
    for key in IGNORED_PENALTIES:           # accepted (OpenAI's clients send them), checked, unused
        _number(body, key, -2, 2)
    _typed(body, "user", (str,), "a string")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is None:
        stop = []
    if (not isinstance(stop, list) or len(stop) > MAX_STOPS
            or not all(isinstance(s, str) and len(s) <= MAX_STOP_CHARS for s in stop)):
        raise RequestError(400, f"'stop' must be a string or a list of at most {MAX_STOPS} strings "
                                f"of at most {MAX_STOP_CHARS} characters", param="stop")
    stream = _typed(body, "stream", (bool,), "a boolean")
    ignore_eos = _typed(body, "ignore_eos", (bool,), "a boolean")    # llama-server's and vLLM's
    opts = _typed(body, "stream_options", (dict,), "an object") or {}
    usage = _typed(opts, "include_usage", (bool,), "a boolean")
    try:
        params = SamplingParams(**sampling)
    except ValueError as e:                 # the checks above should have caught it first
        raise RequestError(400, str(e)) from None
    return GenParams(max_tokens, params, tuple(stop), bool(ignore_eos)), bool(stream), bool(usage)


def chat_messages(body):
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(400, f"messages[{i}] must be an object with a 'role'", param="messages")
        content = m.get("content")
        if isinstance(content, list):       # content parts: only text ones
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(400, f"messages[{i}]: only text content parts are supported",
                                   param="messages")
            content = "".join(p["text"] for p in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise RequestError(400, f"messages[{i}].content must be a string", param="messages")
        out.append({"role": m["role"], "content": content})
    return out


def completion_prompt(body):
    """The prompt of a completion request: text, or token ids."""
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]                            # a batch of one
    if isinstance(p, str) and p:
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return p
    raise RequestError(400, "'prompt' must be a non-empty string or list of token ids", param="prompt")


def context_error(n_prompt, n_ctx):
    return RequestError(
        400, f"This model's maximum context length is {n_ctx} tokens. However, your request has "
             f"{n_prompt} prompt tokens, leaving no room to generate. Please shorten the prompt.",
        code="context_length_exceeded", n_prompt_tokens=n_prompt, n_ctx=n_ctx)


class Reply:
    """The response JSON of one request, whole or as stream chunks."""

    def __init__(self, chat, model, include_usage=False):
        self.chat, self.model, self.include_usage = chat, model, include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, chunk):
        obj = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text, finish, tool_calls=None):
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if self.chat
                  else {"index": 0, "text": text})
        if tool_calls:                  # no content but the calls: null, as OpenAI sends it
            choice["message"].update(content=text if text.strip() else None, tool_calls=tool_calls)
        choice.update(logprobs=None, finish_reason=finish["finish"])
        return {**self._head(False), "choices": [choice], "usage": finish["usage"],
                "timings": finish["timings"]}

    def chunk(self, text=None, finish_reason=None, role=False, tool_calls=None):
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            if tool_calls:
                delta = {"tool_calls": tool_calls}
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or ""}
        choice.update(logprobs=None, finish_reason=finish_reason)
        out = {**self._head(True), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return sse(out)

    def usage_chunk(self, finish):
        return sse({**self._head(True), "choices": [], "usage": finish["usage"],
                    "timings": finish["timings"]})


def sse(obj):
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
