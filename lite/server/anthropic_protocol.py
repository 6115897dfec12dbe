"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) over the same chat-template
rendering, tool calls (tool_calls.py) and scheduler as /v1/chat/completions: the request checked and
turned into OpenAI's chat request (tools as functions, tool_use blocks as tool_calls, tool_result
blocks as tool messages) and GenParams, the reply as a message of text and tool_use blocks or as
Anthropic's stream of named events, and errors as {"type": "error", "error": {"type", "message"}}."""
import json
import uuid

from starlette.responses import JSONResponse
from starlette.routing import Route

from lite.server.openai_protocol import MAX_STOPS, RequestError, _number, gen_params
from lite.server.tool_calls import markup

# OpenAI's error types as Anthropic names them (its 503 is "overloaded_error").
_ERROR_TYPES = {"invalid_request_error": "invalid_request_error",
                "authentication_error": "authentication_error",
                "not_found_error": "not_found_error", "unavailable_error": "overloaded_error",
                "server_error": "api_error"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


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


def _blocks(content, what):
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise RequestError(400, f"{what} must be a string or a list of content blocks")
    return content


def _assistant(blocks, what, ids):
    """An assistant turn's text and tool_use blocks -> an OpenAI assistant message."""
    text, calls = [], []
    for j, b in enumerate(blocks):
        if b.get("type") == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
        elif b.get("type") == "tool_use":
            if not (isinstance(b.get("id"), str) and b["id"] and isinstance(b.get("name"), str)
                    and isinstance(b.get("input"), dict)):
                raise RequestError(400, f"{what}.{j}: a tool_use block needs an 'id', a 'name' and "
                                        "an 'input' object")
            ids.add(b["id"])
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": b["input"]}})
        else:
            raise RequestError(400, f"{what}.{j}: an assistant turn takes text and tool_use blocks")
    return {"role": "assistant", "content": "".join(text), **({"tool_calls": calls} if calls else {})}


def _user(blocks, what, ids):
    """A user turn's tool_result and text blocks -> OpenAI tool messages and a user message."""
    out = []
    for j, b in enumerate(blocks):
        if b.get("type") == "text" and isinstance(b.get("text"), str):
            if out and out[-1]["role"] == "user":
                out[-1]["content"] += b["text"]
            else:
                out.append({"role": "user", "content": b["text"]})
        elif b.get("type") == "tool_result":
            if b.get("tool_use_id") not in ids:
                raise RequestError(400, f"{what}.{j}.tool_use_id: must name a tool_use block of an "
                                        "earlier assistant turn")
            result = _text_of(b.get("content", ""), f"{what}.{j}.content")
            if b.get("is_error") is True:          # the template has no field for it: say it in words
                result = f"Error: {result}"
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": result})
        else:
            raise RequestError(400, f"{what}.{j}: a user turn takes text and tool_result blocks "
                                    "(only text content blocks are supported)")
    return out or [{"role": "user", "content": ""}]


def messages_of(body):
    """The request's system prompt and messages as OpenAI chat messages: tool_use blocks as an
    assistant's tool_calls, tool_result blocks as `role: "tool"` messages."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError(400, "messages: must be a non-empty list")
    out, ids = [], set()
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise RequestError(400, f"messages.{i}.role: must be 'user' or 'assistant'")
        blocks = _blocks(m.get("content"), f"messages.{i}.content")
        if m["role"] == "assistant":
            out.append(_assistant(blocks, f"messages.{i}.content", ids))
        else:
            out += _user(blocks, f"messages.{i}.content", ids)
    if msgs[-1]["role"] != "user":
        raise RequestError(400, "messages: the last message must be from the user "
                                "(a prefilled assistant turn is not supported)")
    system = body.get("system")
    if system is not None:
        system = _text_of(system, "system")
        if system:
            out.insert(0, {"role": "system", "content": system})
    return out


def _tool(t, i):
    """One Anthropic tool -> OpenAI's function tool."""
    if not isinstance(t, dict) or t.get("type", "custom") != "custom":
        raise RequestError(400, f"tools.{i}: only custom tools {{name, description, input_schema}} "
                                "are supported")
    if not isinstance(t.get("name"), str) or not t["name"]:
        raise RequestError(400, f"tools.{i}.name: must be a non-empty string")
    if not isinstance(t.get("input_schema"), dict):
        raise RequestError(400, f"tools.{i}.input_schema: must be a JSON schema object")
    if not isinstance(t.get("description", ""), str):
        raise RequestError(400, f"tools.{i}.description: must be a string")
    fn = {"name": t["name"], "parameters": t["input_schema"]}
    if t.get("description"):
        fn["description"] = t["description"]
    return {"type": "function", "function": fn}


def chat_body(body):
    """A Messages request as the OpenAI chat request tool_calls.chat_prompt renders: messages,
    tools and tool_choice (auto, any: "required", tool: the named function, none)."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError(400, "tools: must be a list of {name, description, input_schema} objects")
    tools = [_tool(t, i) for i, t in enumerate(tools or [])]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) < len(names):
        raise RequestError(400, "tools: tool names must be unique")
    out = {"messages": messages_of(body)}
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in ("auto", "any", "tool", "none"):
            raise RequestError(400, "tool_choice: must be {\"type\": \"auto\" | \"any\" | "
                                    "\"tool\" | \"none\"} (\"tool\" with a \"name\")")
        if not isinstance(choice.get("disable_parallel_tool_use", False), bool):
            raise RequestError(400, "tool_choice.disable_parallel_tool_use: must be a boolean")
        if kind in ("any", "tool") and not tools:
            raise RequestError(400, f"tool_choice: type {kind!r} needs tools")
        if kind == "tool" and choice.get("name") not in names:
            raise RequestError(400, f"tool_choice.name: must name one of the tools, got "
                                    f"{choice.get('name')!r}")
        out["tool_choice"] = {"any": "required", "tool": {"type": "function", "function": {
            "name": choice.get("name")}}}.get(kind, kind)
    if tools:
        out["tools"] = tools
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


def _tool_use(call):
    """An OpenAI tool call as Anthropic's tool_use block; None when its arguments are no JSON
    object (Anthropic's input must be one)."""
    try:
        args = json.loads(call["function"]["arguments"])
    except ValueError:
        return None
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"),
            "name": call["function"]["name"], "input": args} if isinstance(args, dict) else None


def _unparsed(call):
    """A call that makes no tool_use block, given back as the text the model wrote."""
    return markup(call["function"]["name"], call["function"]["arguments"])


class _Blocks:
    """The content blocks of a streamed message, each opened, filled and closed in turn: text
    blocks and tool_use blocks (the input whole in one input_json_delta)."""

    def __init__(self, single):
        self.n, self.open, self.pending, self.tools, self.single = 0, None, "", 0, single

    def _start(self, block):
        self.open = block["type"]
        return [_sse("content_block_start", {"type": "content_block_start", "index": self.n,
                                             "content_block": block})]

    def _delta(self, delta):
        return [_sse("content_block_delta", {"type": "content_block_delta", "index": self.n,
                                             "delta": delta})]

    def close(self):
        if self.open is None:
            return []
        self.open, self.n = None, self.n + 1
        return [_sse("content_block_stop", {"type": "content_block_stop", "index": self.n - 1})]

    def text(self, piece):
        out = []
        if self.open != "text":
            # whitespace before a tool_use block makes no text block (the whole reply drops it too)
            if not (self.pending + piece).strip():
                self.pending += piece
                return []
            piece, self.pending = self.pending + piece, ""
            out = self.close() + self._start({"type": "text", "text": ""})
        return out + self._delta({"type": "text_delta", "text": piece})

    def calls(self, calls):
        out = []
        for call in calls:
            block = _tool_use(call)
            if block is None:
                out += self.text(_unparsed(call))
                continue
            if self.single and self.tools:
                continue
            self.pending, self.tools = "", self.tools + 1
            out += self.close() + self._start({**block, "input": {}})
            out += self._delta({"type": "input_json_delta",
                                "partial_json": json.dumps(block["input"], ensure_ascii=False)})
            out += self.close()
        return out

    def end(self):
        """The last block closed; a reply with none gets its (maybe empty) text block."""
        out = []
        if self.n == 0 and self.open is None:
            out = self._start({"type": "text", "text": ""})
            if self.pending:
                out += self._delta({"type": "text_delta", "text": self.pending})
        return out + self.close()


class MessageReply:
    """The response of one Messages request: whole, or as Anthropic's stream events."""

    def __init__(self, model, n_input, single=False):
        # single: disable_parallel_tool_use, the calls after the first left out
        self.model, self.n_input, self.single = model, n_input, single
        self.id = "msg_" + uuid.uuid4().hex[:24]

    def _message(self, content, finish, used_tools=False):
        reason = stop = None
        if finish is not None:
            stop = finish.get("stop_sequence")
            reason = "stop_sequence" if stop else _STOP_REASONS[finish["finish"]]
            if reason == "tool_use" and not used_tools:      # the calls did not make blocks
                reason = "end_turn"
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": reason, "stop_sequence": stop,
                "usage": {"input_tokens": self.n_input,
                          "output_tokens": finish["usage"]["completion_tokens"] if finish else 0}}

    def whole(self, text, finish, tool_calls=None):
        """The text block (left out when it is only whitespace before tool_use blocks), then the
        tool_use blocks."""
        blocks = [_tool_use(c) for c in tool_calls or []]
        text = "".join([text] + [_unparsed(c) for c, b in zip(tool_calls or [], blocks) if b is None])
        uses = [b for b in blocks if b is not None][:1 if self.single else None]
        content = ([{"type": "text", "text": text}] if text.strip() or not uses else []) + uses
        return {**self._message(content, finish, bool(uses)), "timings": finish["timings"]}

    async def stream(self, events):
        """message_start, ping, the content blocks in turn, message_delta, message_stop."""
        yield _sse("message_start", {"type": "message_start", "message": self._message([], None)})
        yield _sse("ping", {"type": "ping"})
        blocks = _Blocks(self.single)
        while True:
            ev = await events.get()
            if "text" in ev or "tool_calls" in ev:
                for out in (blocks.text(ev["text"]) if "text" in ev else blocks.calls(ev["tool_calls"])):
                    yield out
                continue
            if "finish" in ev:
                for out in blocks.end():
                    yield out
                m = self._message([], ev, blocks.tools > 0)
                yield _sse("message_delta", {
                    "type": "message_delta", "usage": {"output_tokens": m["usage"]["output_tokens"]},
                    "delta": {"stop_reason": m["stop_reason"], "stop_sequence": m["stop_sequence"]}})
                yield _sse("message_stop", {"type": "message_stop"})
            else:
                yield _sse("error", error_body(RequestError(500, ev["error"], type="server_error")))
            break


def message_routes(endpoint, body_of, chat_request, generate, model_name):
    """The two routes, on app.py's endpoint wrapper, request body, prompt (chat template, tools and
    the grammar forcing a call: chat_request(OpenAI chat body)) and scheduler submission, the ones
    /v1/chat/completions uses, errors in Anthropic's shape."""
    async def messages(request):
        body = await body_of(request)
        params, stream = params_of(body)
        ids, constraint, tools = await chat_request(chat_body(body))
        single = (body.get("tool_choice") or {}).get("disable_parallel_tool_use", False)
        return await generate(request, MessageReply(model_name, len(ids), single), ids, params, stream,
                              chunks=MessageReply.stream, error=error_response,
                              constraint=constraint, wrap=tools.wrap)

    async def count_tokens(request):
        ids, _, _ = await chat_request(chat_body(await body_of(request)))
        return JSONResponse({"input_tokens": len(ids)})

    return [Route("/v1/messages", endpoint(messages, error_response), methods=["POST"]),
            Route("/v1/messages/count_tokens", endpoint(count_tokens, error_response), methods=["POST"])]
