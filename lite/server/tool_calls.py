"""Tool calls in chat requests: `tools` and `tool_choice` checked, the tools passed to the model's
own chat template as `tools` (or described in a system message when the template knows none), the
conversation's tool calls and tool results rendered, and the model's tool-call markup parsed back
into OpenAI's `tool_calls`, whole or as stream deltas.

Two markups cover the families lite runs: Hermes-style (Qwen 2.5 / 3, Hermes, and the fallback for
templates without tools): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; and
Llama 3's: the reply is a JSON object `{"name": ..., "parameters": {...}}`. `tool_choice`
"required" or a named function constrains decoding to that markup through the grammar machinery.
"""
import json
import re
import uuid

from lite.server import grammar
from lite.server.openai_protocol import RequestError

HERMES, LLAMA3 = "hermes", "llama3"
START, END = "<tool_call>", "</tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def family(template):
    """The tool-call markup a chat template's model writes."""
    t = template or ""
    if START not in t and ("<|python_tag|>" in t or "ipython" in t):
        return LLAMA3
    return HERMES


def markup(name, arguments):
    """A call written in Hermes-style markup."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{START}\n{call}\n{END}"


def new_call(name, arguments, index=0):
    """An OpenAI tool call (arguments as a JSON string), with a fresh id."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"index": index, "id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _call_of(obj, index):
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return new_call(obj["name"], args, index) if isinstance(args, (dict, str)) else None


def _json_calls(text, index):
    """JSON objects with a name, one after another (`;` or whitespace between): calls, or None."""
    dec, calls, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
        if i == len(text):
            return calls or None
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError:
            return None
        call = _call_of(obj, index + len(calls))
        if call is None:
            return None
        calls.append(call)


def parse(text, fam, index=0):
    """A reply's text -> (content: the text outside the markup, or None; tool calls). Markup that
    does not parse stays in the content."""
    if fam == LLAMA3:
        body = text.strip().removeprefix("<|python_tag|>")
        calls = _json_calls(body, index) if body.startswith("{") else None
        return (None, calls) if calls else (text, [])
    calls, content, last = [], [], 0
    for m in _HERMES_CALL.finditer(text):
        found = _json_calls(m.group(1), index + len(calls))
        if found is None:
            continue
        calls += found
        content.append(text[last:m.start()])
        last = m.end()
    content = "".join(content + [text[last:]]).strip()
    return (content or None), calls


class ToolCallStream:
    """Sits between the scheduler and the HTTP side (an emit wrapper): text events pass on as
    content until the markup starts; the markup is held and goes out as {"tool_calls": [...]}
    events, and a request that made calls finishes with "tool_calls"."""

    def __init__(self, emit, fam):
        self.emit, self.fam = emit, fam
        self.held, self.markup, self.n_calls = "", False, 0

    def __call__(self, ev):
        if "text" in ev:
            self._text(ev["text"])
            return
        if "finish" in ev:
            self._end()
            if self.n_calls and ev["finish"] == "stop":
                ev = {**ev, "finish": "tool_calls"}
        self.emit(ev)

    def _send(self, text):
        if text:
            self.emit({"text": text})

    def _calls(self, calls):
        self.n_calls += len(calls)
        self.emit({"tool_calls": calls})

    def _text(self, piece):
        buf = self.held + piece
        if self.fam == LLAMA3:
            if self.markup is None:           # the reply did not start with a call: plain text
                return self._send(piece)
            if not self.markup:
                body = buf.lstrip()
                if not body:
                    self.held = buf
                    return
                if not body.startswith("{"):
                    self.markup, self.held = None, ""
                    return self._send(buf)
                self.markup = True
            self.held = buf
            return
        while True:
            if not self.markup:
                i = buf.find(START)
                if i < 0:
                    keep = _partial(buf, START)
                    self.held = buf[len(buf) - keep:]
                    return self._send(buf[:len(buf) - keep])
                self._send(buf[:i])
                buf, self.markup = buf[i:], True
            j = buf.find(END)
            if j < 0:
                self.held = buf
                return
            block, buf = buf[:j + len(END)], buf[j + len(END):]
            content, calls = parse(block, HERMES, self.n_calls)
            if calls:
                self._calls(calls)
            else:
                self._send(content)
            self.markup = False
            if self.n_calls:                   # whitespace between calls is not content
                buf = buf.lstrip()

    def _end(self):
        held, self.held = self.held, ""
        if not held:
            return
        if self.markup:
            content, calls = parse(held, self.fam, self.n_calls)
            if calls:
                self._calls(calls)
                held = content or ""
        if not (self.n_calls and not held.strip()):
            self._send(held)


def _partial(buf, s):
    """The length of the longest end of `buf` that begins `s`."""
    for n in range(min(len(s) - 1, len(buf)), 0, -1):
        if buf.endswith(s[:n]):
            return n
    return 0


def stream_deltas(call):
    """The stream deltas of one tool call, as OpenAI sends them: its index, id, type and name
    (arguments empty), then its arguments."""
    fn = call["function"]
    return [[{"index": call["index"], "id": call["id"], "type": "function",
              "function": {"name": fn["name"], "arguments": ""}}],
            [{"index": call["index"], "function": {"arguments": fn["arguments"]}}]]


def message_calls(calls):
    """Tool calls as a whole message carries them (no index)."""
    return [{k: v for k, v in c.items() if k != "index"} for c in calls]


# --- the request side ---------------------------------------------------------------------------
SYSTEM_TOOLS = (
    "You may call one or more functions to help with the user's request. The functions, in JSON "
    "within <tools></tools>:\n<tools>\n{tools}\n</tools>\n\nTo call one, reply with a JSON object "
    "holding its name and arguments within <tool_call></tool_call> tags:\n"
    "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <arguments-json-object>}}\n</tool_call>")


class ToolRequest:
    """A chat request's `tools` and `tool_choice`, checked, and what follows from them for the
    template's messages, the constraint on decoding and the reply."""

    def __init__(self, body, template):
        self.template = template or ""
        self.family = family(template)
        # a template that reads `tools` renders them (and the calls and results) itself
        self.native = "tools" in self.template
        tools = body.get("tools")
        if tools is not None and (not isinstance(tools, list) or not all(map(_is_tool, tools))):
            raise RequestError(400, "'tools' must be a list of {\"type\": \"function\", \"function\": "
                                    "{\"name\", \"description\", \"parameters\"}} objects",
                               param="tools")
        self.tools = tools or []
        names = [t["function"]["name"] for t in self.tools]
        choice = body.get("tool_choice", "auto" if self.tools else "none")
        if isinstance(choice, dict):
            fn = choice.get("function")
            if choice.get("type") != "function" or not isinstance(fn, dict) or \
                    not isinstance(fn.get("name"), str):
                raise RequestError(400, "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                        "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                                   param="tool_choice")
            if fn["name"] not in names:
                raise RequestError(400, f"tool_choice names {fn['name']!r}, which is not in 'tools'",
                                   param="tool_choice")
            choice = fn["name"]
        elif choice not in ("none", "auto", "required"):
            raise RequestError(400, f"'tool_choice' must be \"none\", \"auto\", \"required\" or a "
                                    f"named function, got {choice!r}", param="tool_choice")
        elif choice == "required" and not self.tools:
            raise RequestError(400, "tool_choice \"required\" needs 'tools'", param="tool_choice")
        self.choice = choice
        self.active = bool(self.tools) and choice != "none"

    def template_vars(self):
        return {"tools": self.tools} if self.active and self.native else {}

    def messages(self, raw, messages):
        """The messages the template gets: chat_messages' (role, content) with the tool fields of
        the raw ones kept (call arguments as objects, as templates expect); for a template without
        tools, calls written as markup, results as user turns and the tools in the system text."""
        out = []
        for i, (r, m) in enumerate(zip(raw, messages)):
            m = dict(m)
            if r.get("tool_calls"):
                m["tool_calls"] = _calls_in(r["tool_calls"], i)
            for key in ("tool_call_id", "name"):
                if isinstance(r.get(key), str):
                    m[key] = r[key]
            out.append(m)
        if self.native:
            return out
        return self._plain(out)

    def _plain(self, msgs):
        out = []
        for m in msgs:
            if m.get("tool_calls"):
                marks = [markup(c["function"]["name"], c["function"]["arguments"])
                         for c in m["tool_calls"]]
                m = {"role": m["role"], "content": "\n".join(filter(None, [m["content"], *marks]))}
            elif m["role"] == "tool":
                result = f"<tool_response>\n{m['content']}\n</tool_response>"
                if out and out[-1].get("tool_results"):      # results of one turn in one message
                    out[-1]["content"] += "\n" + result
                    continue
                m = {"role": "user", "content": result, "tool_results": True}
            out.append(m)
        out = [{k: v for k, v in m.items() if k != "tool_results"} for m in out]
        if self.active:
            text = SYSTEM_TOOLS.format(tools="\n".join(json.dumps(t, ensure_ascii=False)
                                                       for t in self.tools))
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + text}
            else:
                out.insert(0, {"role": "system", "content": text})
        return out

    def grammar(self):
        """The grammar forcing a call (tool_choice "required" or named), or None."""
        if self.choice in ("none", "auto"):
            return None
        key = "parameters" if self.family == LLAMA3 else "arguments"
        schemas = [{"type": "object", "required": ["name", key],
                    "properties": {"name": {"const": t["function"]["name"]},
                                   key: t["function"].get("parameters") or
                                   {"type": "object", "properties": {}}}}
                   for t in self.tools if self.choice in ("required", t["function"]["name"])]
        call = grammar.lark_json(schemas[0] if len(schemas) == 1 else {"anyOf": schemas})
        lark = (f"start: call\ncall: {call}" if self.family == LLAMA3 else
                f'start: "{START}\\n" call "\\n{END}"\ncall: {call}')
        return grammar.load_llguidance().LLMatcher.grammar_from_lark(lark)

    def wrap(self, emit):
        """The emit the scheduler gets: tool-call markup parsed out when tools are active."""
        return ToolCallStream(emit, self.family) if self.active else emit


def _is_tool(t):
    fn = t.get("function") if isinstance(t, dict) else None
    return (t.get("type") == "function" and isinstance(fn, dict)
            and isinstance(fn.get("name"), str) and bool(fn["name"])
            and isinstance(fn.get("parameters", {}), dict))


def _calls_in(calls, i):
    """An assistant message's tool_calls, their arguments parsed from JSON text into objects."""
    bad = RequestError(400, f"messages[{i}].tool_calls must be a list of {{\"id\", \"type\": "
                            "\"function\", \"function\": {\"name\", \"arguments\"}} objects",
                       param="messages")
    if not isinstance(calls, list):
        raise bad
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise RequestError(400, f"messages[{i}].tool_calls: arguments of "
                                        f"{fn['name']!r} are not JSON", param="messages") from None
        out.append({"id": c.get("id", ""), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def chat_prompt(body, messages, tok):
    """A chat request -> (prompt ids, Constraint or None, ToolRequest): the messages rendered with
    the tools through the model's template, and the grammar the request asks for (response_format,
    grammar, regex) or the one that forces a tool call. Slow: run it off the event loop."""
    from lite.files.chat_template import builtin_template
    tools = ToolRequest(body, tok.chat_template or builtin_template(tok.architecture))
    text, param = grammar.request_grammar(body)
    forced = tools.grammar()
    if forced is not None:
        if text is not None:
            raise RequestError(400, f"a forced tool_choice cannot be combined with '{param}'",
                               param="tool_choice")
        text, param = forced, "tool_choice"
    msgs = tools.messages(body["messages"], messages)
    # the contents are text: only the template's markup makes control tokens
    ids = tok.encode_chat(msgs, add_generation_prompt=True, **tools.template_vars())
    constraint = grammar.make_constraint(tok, text, param) if text is not None else None
    return ids, constraint, tools
