"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) over the same chat-template
rendering and scheduler as /v1/chat/completions: the request checked and turned into chat messages
and GenParams, the reply as a message or as Anthropic's stream of named events, and errors as
{"type": "error", "error": {"type", "message"}}."""
import json
import uuid

from starlette.responses import JSONResponse
from starlette.routing import Route

from lite.server.openai_protocol import MAX_STOPS, RequestError, _number, chat_messages, gen_params

# OpenAI's error types as Anthropic names them (its 503 is "overloaded_error").
_ERROR_TYPES = {"invalid_request_error": "invalid_request_error",
                "authentication_error": "authentication_error",
                "not_found_error": "not_found_error", "unavailable_error": "overloaded_error",
                "server_error": "api_error"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def error_response(e, request=None):
    """A RequestError in Anthropic's error shape, its HTTP status kept (request: app.py's error
    formatters take it; this shape has no request id)."""
    return JSONResponse(error_body(e), status_code=e.status)


def error_body(e):
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(e.type, "api_error"), "message": e.message}}


def api_key_of(headers):
    """The key a request carries: Anthropic's `x-api-key`, or OpenAI's `Authorization: Bearer`."""
    key = headers.get("x-api-key")
    if key is not None:
        return key
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None   # RFC 9110: any case


def _text_of(value, what):
    """A string, or a list of text blocks joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                       and isinstance(b.get("text"), str) for b in value):
        return "".join(b["text"] for b in value)
    raise RequestError(400, f"{what} must be a string or a list of text blocks "
                            "(only text content blocks are supported)")


def messages_of(body):
    """The request's system prompt and messages as chat-template messages."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError(400, "messages: must be a non-empty list")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise RequestError(400, f"messages.{i}.role: must be 'user' or 'assistant'")
        _text_of(m.get("content"), f"messages.{i}.content")
    if msgs[-1]["role"] != "user":
        raise RequestError(400, "messages: the last message must be from the user "
                                "(a prefilled assistant turn is not supported)")
    if body.get("tools"):
        raise RequestError(400, "tools: tool use is not supported")
    out = chat_messages({"messages": msgs})
    system = body.get("system")
    if system is not None:
        system = _text_of(system, "system")
        if system:
            out.insert(0, {"role": "system", "content": system})
    return out


def params_of(body):
    """The generation fields of a Messages request -> (GenParams, stream)."""
    if body.get("max_tokens") is None:
        raise RequestError(400, "max_tokens: field required")
    _number(body, "temperature", 0, 1)      # Anthropic's range, narrower than OpenAI's
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or len(stops) > MAX_STOPS
                              or not all(isinstance(s, str) for s in stops)):
        raise RequestError(400, f"stop_sequences: must be a list of at most {MAX_STOPS} strings")
    fields = {k: body.get(k) for k in ("max_tokens", "temperature", "top_p", "top_k", "stream")}
    params, stream, _ = gen_params({**fields, "stop": stops or []})
    return params, stream


def _sse(event, obj):
    return f"event: {event}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"


class MessageReply:
    """The response of one Messages request: whole, or as Anthropic's stream events."""

    def __init__(self, model, n_input):
        self.model, self.n_input = model, n_input
        self.id = "msg_" + uuid.uuid4().hex[:24]

    def _message(self, text, finish):
        reason = stop = None
        if finish is not None:
            stop = finish.get("stop_sequence")
            reason = "stop_sequence" if stop else _STOP_REASONS[finish["finish"]]
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [] if text is None else [{"type": "text", "text": text}],
                "stop_reason": reason, "stop_sequence": stop,
                "usage": {"input_tokens": self.n_input,
                          "output_tokens": finish["usage"]["completion_tokens"] if finish else 0}}

    def whole(self, text, finish, tool_calls=None):      # no tools here: /v1/messages refuses them
        return {**self._message(text, finish), "timings": finish["timings"]}

    async def stream(self, events):
        """message_start, one text block (start, ping, deltas, stop), message_delta, message_stop."""
        yield _sse("message_start", {"type": "message_start", "message": self._message(None, None)})
        yield _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})
        yield _sse("ping", {"type": "ping"})
        while True:
            ev = await events.get()
            if "text" in ev:
                yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "text_delta", "text": ev["text"]}})
                continue
            if "finish" in ev:
                yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
                m = self._message("", ev)
                yield _sse("message_delta", {
                    "type": "message_delta", "usage": {"output_tokens": m["usage"]["output_tokens"]},
                    "delta": {"stop_reason": m["stop_reason"], "stop_sequence": m["stop_sequence"]}})
                yield _sse("message_stop", {"type": "message_stop"})
            else:
                yield _sse("error", error_body(RequestError(500, ev["error"], type="server_error")))
            break


def message_routes(endpoint, body_of, chat_ids, generate, model_name):
    """The two routes, on app.py's endpoint wrapper, request body, chat-template encoding and
    scheduler submission (the ones /v1/chat/completions uses), errors in Anthropic's shape."""
    async def messages(request):
        body = await body_of(request)
        params, stream = params_of(body)
        ids = await chat_ids(messages_of(body))
        return await generate(request, MessageReply(model_name, len(ids)), ids, params, stream,
                              chunks=MessageReply.stream, error=error_response)

    async def count_tokens(request):
        ids = await chat_ids(messages_of(await body_of(request)))
        return JSONResponse({"input_tokens": len(ids)})

    return [Route("/v1/messages", endpoint(messages, error_response), methods=["POST"]),
            Route("/v1/messages/count_tokens", endpoint(count_tokens, error_response), methods=["POST"])]
