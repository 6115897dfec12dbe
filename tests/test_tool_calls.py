"""Tool calls without a model: each family's markup parsed into OpenAI's tool_calls, whole and fed
to the stream filter a character at a time; `tools`, assistant tool calls and `role: "tool"` results
rendered through Qwen-, Hermes- and Llama 3-style templates (and templates that know no tools);
tools / tool_choice checked; and the grammar that forces a call accepts exactly each family's
markup, walked token by token on SmolLM2's tokenizer."""
import json

import pytest

from lite.files.chat_template import CHATML, GEMMA
from lite.server.openai_protocol import RequestError
from lite.server.tool_calls import HERMES, LLAMA3, ToolCallStream, ToolRequest, family, parse, stream_deltas

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
                                                                           "properties": {}}}}

# Templates written the way each family's own writes tools, calls and results.
QWEN = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "Return a call within <tool_call></tool_call> tags.<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{{- message.content }}{%- for tc in message.tool_calls %}{%- set tc = tc.function %}"
    "\n<tool_call>\n{\"name\": \"{{ tc.name }}\", \"arguments\": {{ tc.arguments | tojson }}}\n</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
HERMES_TMPL = QWEN.replace("# Tools", "You are a function calling AI model.").replace(
    "{%- elif message.role == 'tool' %}<|im_start|>user", "{%- elif message.role == 'tool' %}<|im_start|>tool")
LLAMA3_TMPL = (
    "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython<|eot_id|>"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' and loop.first and tools %}<|start_header_id|>user<|end_header_id|>\n\n"
    "Respond with {\"name\": function name, \"parameters\": dictionary of arguments}."
    "{%- for t in tools %}\n{{ t | tojson(indent=4) }}{%- endfor %}\n\n{{ message.content }}<|eot_id|>"
    "{%- elif message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{%- set tc = message.tool_calls[0].function %}"
    "{\"name\": \"{{ tc.name }}\", \"parameters\": {{ tc.arguments | tojson }}}<|eot_id|>"
    "{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ message.content }}<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n"
    "{{ message.content }}<|eot_id|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}")

HERMES_TEXT = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
LLAMA3_TEXT = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}'
PARIS = {"city": "Paris", "unit": "c"}


def named(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_family_from_template():
    assert family(QWEN) == HERMES and family(HERMES_TMPL) == HERMES
    assert family(LLAMA3_TMPL) == LLAMA3
    assert family(CHATML) == HERMES               # no tools of its own: the fallback markup


@pytest.mark.parametrize("text,fam,content,calls", [
    (HERMES_TEXT, HERMES, "Let me look.", [("get_weather", PARIS), ("get_time", {})]),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}', HERMES,
     None, [("get_weather", PARIS)]),                                   # stopped before the close
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>', HERMES,
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>', []),   # broken JSON
    ("No tools needed.", HERMES, "No tools needed.", []),
    (LLAMA3_TEXT, LLAMA3, None, [("get_weather", PARIS)]),
    ("<|python_tag|>" + LLAMA3_TEXT + "; " + '{"name": "get_time", "parameters": {}}', LLAMA3, None,
     [("get_weather", PARIS), ("get_time", {})]),
    ('{"city": "Paris"}', LLAMA3, '{"city": "Paris"}', []),             # JSON, but not a call
    ("It is sunny.", LLAMA3, "It is sunny.", []),
])
def test_parse_each_family(text, fam, content, calls):
    got_content, got = parse(text, fam)
    assert got_content == content and named(got) == calls
    assert [c["index"] for c in got] == list(range(len(calls)))
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in got)
    assert len({c["id"] for c in got}) == len(got)


def run_stream(text, fam, finish="stop"):
    events = []
    s = ToolCallStream(events.append, fam)
    for ch in text:                       # every split point a token boundary could make
        s({"text": ch})
    s({"finish": finish, "usage": {}, "timings": {}})
    return events


@pytest.mark.parametrize("text,fam", [(HERMES_TEXT, HERMES), (LLAMA3_TEXT, LLAMA3),
                                      ("  " + LLAMA3_TEXT, LLAMA3)])
def test_stream_filter_gives_the_whole_parse(text, fam):
    events = run_stream(text, fam)
    content, calls = parse(text, fam)
    texts = "".join(e["text"] for e in events if "text" in e)
    streamed = [c for e in events if "tool_calls" in e for c in e["tool_calls"]]
    assert texts.strip() == (content or "") and named(streamed) == named(calls)
    assert [c["index"] for c in streamed] == list(range(len(calls)))
    assert events[-1]["finish"] == "tool_calls"
    if content:                           # the content went out before the first call
        first_call = next(i for i, e in enumerate(events) if "tool_calls" in e)
        assert all("text" in e for e in events[:first_call])


@pytest.mark.parametrize("text,fam", [("a < b and <tool is not a call", HERMES),
                                      ("plain <tool_cal", HERMES), ("Sunny, {maybe}", LLAMA3),
                                      ('{"not": "a call"}', LLAMA3)])
def test_stream_filter_passes_text_that_is_no_call(text, fam):
    events = run_stream(text, fam)
    assert "".join(e["text"] for e in events if "text" in e) == text
    assert events[-1]["finish"] == "stop" and not any("tool_calls" in e for e in events)


def test_stream_filter_keeps_length_finish():
    assert run_stream(HERMES_TEXT, HERMES, finish="length")[-1]["finish"] == "length"


def test_stream_deltas_as_openai_sends_them():
    (call,) = parse(LLAMA3_TEXT, LLAMA3)[1]
    head, args = stream_deltas(call)
    assert head == [{"index": 0, "id": call["id"], "type": "function",
                     "function": {"name": "get_weather", "arguments": ""}}]
    assert args == [{"index": 0, "function": {"arguments": call["function"]["arguments"]}}]


CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps(PARIS)}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
]


def render(template, body):
    from lite.server.openai_protocol import chat_messages
    req = ToolRequest(body, template)
    msgs = req.messages(body["messages"], chat_messages(body))
    from lite.files.chat_template import render_chat
    return render_chat(template, msgs, **req.template_vars())


@pytest.mark.parametrize("template", [QWEN, HERMES_TMPL, LLAMA3_TMPL], ids=["qwen", "hermes", "llama3"])
def test_tools_calls_and_results_render_through_the_template(template):
    text = render(template, {"messages": CONVERSATION, "tools": [WEATHER]})
    assert '"description": "The weather of a city"' in text
    key = "parameters" if template is LLAMA3_TMPL else "arguments"
    # the call's arguments render as the object they are, not as a quoted JSON string
    assert f'{{"name": "get_weather", "{key}": {json.dumps(PARIS)}}}' in text
    assert "22 C, sunny" in text
    assert "get_weather" not in render(template, {"messages": CONVERSATION[:1]})


@pytest.mark.parametrize("template", [CHATML, GEMMA], ids=["chatml", "gemma"])
def test_template_without_tools_gets_them_as_text(template):
    text = render(template, {"messages": CONVERSATION + [CONVERSATION[2]], "tools": [WEATHER]})
    assert "<tools>" in text and '"get_weather"' in text
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {json.dumps(PARIS)}}}\n</tool_call>' in text
    # both results in one user turn (Gemma's roles alternate)
    assert text.count("<tool_response>\n22 C, sunny\n</tool_response>") == 2
    assert "tool\n" not in text.replace("</tool_response>", "")
    # tool_choice "none": no tools described
    assert "<tools>" not in render(template, {"messages": CONVERSATION, "tools": [WEATHER],
                                              "tool_choice": "none"})


@pytest.mark.parametrize("body,param", [
    ({"tools": {"name": "f"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_bad_tools_are_400_naming_the_field(body, param):
    with pytest.raises(RequestError) as e:
        ToolRequest(body, QWEN)
    assert e.value.status == 400 and e.value.param == param


def test_bad_call_arguments_in_history_are_400():
    bad = [CONVERSATION[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": "{nope"}}]}]
    with pytest.raises(RequestError) as e:
        render(QWEN, {"messages": bad, "tools": [WEATHER]})
    assert e.value.status == 400 and e.value.param == "messages"


# --- the grammar forcing a call, on a real tokenizer -------------------------------------------
@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("llguidance")
    from conftest import real_model
    from lite.files.gguf_file import GGUFFile
    from lite.files.tokenizer import Tokenizer
    return Tokenizer.from_metadata(GGUFFile(real_model("smollm2")).metadata)


def accepts(tok, grammar_text, text):
    """Whether the grammar takes `text` token by token and is then complete."""
    import numpy as np
    from lite.server.grammar import make_constraint
    c = make_constraint(tok, grammar_text, "tool_choice")
    for t in tok.encode(text, add_special=False):
        if not np.isfinite(c.mask(np.zeros(tok.n_vocab, np.float32))[t]) or not c.advance(t):
            return False
    return c.done


@pytest.mark.parametrize("template,choice,good,bad", ids=["qwen-required", "qwen-named", "llama3"], argvalues=[
    (QWEN, "required",
     ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "f"}}\n</tool_call>',
      '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'],
     ['<tool_call>\n{"name": "get_news", "arguments": {}}\n</tool_call>',
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "k"}}\n</tool_call>',
      '{"name": "get_time", "arguments": {}}', "Sure!"]),
    (QWEN, {"type": "function", "function": {"name": "get_time"}},
     ['<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'],
     ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "f"}}\n</tool_call>',
      '<tool_call>\n{"name": "get_time", "arguments": {"x": 1}}\n</tool_call>']),
    (LLAMA3_TMPL, "required",
     ['{"name": "get_weather", "parameters": {"city": "Rome", "unit": "c"}}'],
     ['{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}',
      '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>']),
])
def test_forced_call_grammar_takes_the_family_markup_only(tok, template, choice, good, bad):
    g = ToolRequest({"tools": [WEATHER, TIME], "tool_choice": choice}, template).grammar()
    assert all(accepts(tok, g, t) for t in good)
    assert not any(accepts(tok, g, t) for t in bad)
    assert ToolRequest({"tools": [WEATHER], "tool_choice": "auto"}, template).grammar() is None
