"""`lite serve`'s /v1/messages as the official `anthropic` client uses it: SmolLM2 on the CPU in a
subprocess on 127.0.0.1 (test_server.py's ServerProcess), the same conversation through Anthropic's
Messages API and OpenAI's chat endpoint, and Anthropic's error shape; tool use: a forced call's
tool_use block (whole and streamed) validates against the tool's input_schema, and its tool_result
renders as the OpenAI endpoint's tool message does. Bounded: short replies."""
import json

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from conftest import real_model  # noqa: E402
from test_server import ALIAS, KEY, httpx  # noqa: E402
from live_server import running  # noqa: E402

N = 12
SYSTEM = "You answer in one short sentence."
TURNS = [{"role": "user", "content": "Name a colour."},
         {"role": "assistant", "content": [{"type": "text", "text": "Blue."}]},
         {"role": "user", "content": "Why is the sky blue?"}]
GREEDY = {"temperature": 0}         # the newest client sends sampling fields through extra_body
EVENTS = ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
          "message_delta", "message_stop"]


@pytest.fixture(scope="module")
def server():
    with running(real_model("smollm2"), "-np", "2", "-c", "512", "--alias", ALIAS, api_key=KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def whole(client):
    return client.messages.create(model=ALIAS, max_tokens=N, system=SYSTEM, messages=TURNS,
                                  extra_body=GREEDY)


def openai_messages():
    flat = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
             else m["content"][0]["text"]} for m in TURNS]
    return [{"role": "system", "content": SYSTEM}, *flat]


def raw_stream(client, **kw):
    """The text and the event types of a streamed message, read from the client's raw events."""
    parts, types, delta = [], [], None
    with client.messages.create(model=ALIAS, system=SYSTEM, stream=True, extra_body=GREEDY,
                                **kw) as events:
        for ev in events:
            types.append(ev.type)
            if ev.type == "content_block_delta":
                assert ev.delta.type == "text_delta"
                parts.append(ev.delta.text)
            elif ev.type == "message_delta":
                delta = ev
    return "".join(parts), types, delta


def test_message_streamed_equals_whole_equals_openai(server, client, whole):
    assert whole.type == "message" and whole.role == "assistant" and whole.model == ALIAS
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text
    text = whole.content[0].text

    streamed, types, delta = raw_stream(client, max_tokens=N, messages=TURNS)
    assert streamed == text
    assert [t for i, t in enumerate(types) if t not in types[:i]] == EVENTS
    assert types.count("message_start") == types.count("message_stop") == 1
    assert delta.delta.stop_reason == whole.stop_reason
    assert delta.usage.output_tokens == whole.usage.output_tokens

    with client.messages.stream(model=ALIAS, max_tokens=N, system=SYSTEM, messages=TURNS,
                                extra_body=GREEDY) as s:
        final = s.get_final_message()      # the client's own assembly of the events
    assert final.content[0].text == text and final.usage.input_tokens == whole.usage.input_tokens

    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=120, max_retries=0)
    chat = oa.chat.completions.create(model=ALIAS, messages=openai_messages(), max_tokens=N, temperature=0)
    assert chat.choices[0].message.content == text
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.usage.output_tokens == chat.usage.completion_tokens
    assert whole.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    assert whole.stop_sequence is None


def test_stream_has_named_events_and_ping(server):
    """On the wire: each event's name is its data's type, and a ping comes (the client hides it)."""
    body = {"model": ALIAS, "max_tokens": 2, "stream": True, "messages": TURNS[:1]}
    with server.http.stream("POST", "/v1/messages", json=body) as r:
        frames = [f for f in r.read().decode().split("\n\n") if f.strip()]
    names = []
    for f in frames:
        event, data = f.split("\n")
        names.append(event.removeprefix("event: "))
        assert json.loads(data.removeprefix("data: "))["type"] == names[-1]
    assert "ping" in names and names[0] == "message_start" and names[-1] == "message_stop"


def test_stop_sequences(client, whole):
    text = whole.content[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]                     # a word the greedy reply reaches
    cut = client.messages.create(model=ALIAS, max_tokens=N, system=SYSTEM, messages=TURNS,
                                 stop_sequences=[stop, "no such text"], extra_body=GREEDY)
    assert cut.content[0].text == text[:text.index(stop)]
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    streamed, _, delta = raw_stream(client, max_tokens=N, messages=TURNS, stop_sequences=[stop])
    assert streamed == cut.content[0].text
    assert (delta.delta.stop_reason, delta.delta.stop_sequence) == ("stop_sequence", stop)


def test_count_tokens(server, client, whole, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)     # the Bearer client below sends only that
    n = client.messages.count_tokens(model=ALIAS, system=SYSTEM, messages=TURNS).input_tokens
    assert n == whole.usage.input_tokens
    shorter = client.messages.count_tokens(model=ALIAS, system=SYSTEM, messages=TURNS[:1]).input_tokens
    assert 0 < shorter < n
    bearer = anthropic.Anthropic(base_url=server.url, auth_token=KEY, max_retries=0)   # Bearer works too
    assert bearer.messages.count_tokens(model=ALIAS, system=SYSTEM, messages=TURNS).input_tokens == n


def _anthropic_error(e, status, kind):
    assert e.status_code == status
    assert e.body["type"] == "error" and e.body["error"]["type"] == kind
    assert isinstance(e.body["error"]["message"], str) and e.body["error"]["message"]


def test_errors_in_anthropic_shape(server, client):
    bad_key = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad_key.messages.create(model=ALIAS, max_tokens=1, messages=TURNS[:1])
    _anthropic_error(e.value, 401, "authentication_error")
    bad = [dict(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
           dict(messages=[]), dict(messages=[{"role": "system", "content": "x"}]),
           dict(messages=TURNS[:2]), dict(messages=TURNS[:1], extra_body={"temperature": 1.5}),
           dict(messages=TURNS[:1], stop_sequences="x"), dict(messages=TURNS[:1], system=[{"type": "x"}])]
    for kw in bad:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model=ALIAS, max_tokens=4, **kw)
        _anthropic_error(e.value, 400, "invalid_request_error")
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="no-such-model", max_tokens=1, messages=TURNS[:1])
    _anthropic_error(e.value, 404, "not_found_error")
    for r, status in [(server.http.post("/v1/messages", json={"messages": TURNS[:1]}), 400),
                      (server.http.post("/v1/messages", content=b"{not json"), 400),
                      (server.http.get("/v1/messages"), 405),
                      (httpx.post(server.url + "/v1/messages/count_tokens", json={"messages": TURNS}), 401)]:
        assert r.status_code == status and r.json()["type"] == "error", r.text


# --- tool use ------------------------------------------------------------------------------------
WEATHER = {"name": "get_weather", "description": "The weather of a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
FORCED = {"type": "tool", "name": "get_weather"}


@pytest.fixture(scope="module")
def forced(client):
    pytest.importorskip("llguidance")
    return client.messages.create(model=ALIAS, max_tokens=64, messages=[QUESTION], tools=[WEATHER],
                                  tool_choice=FORCED, extra_body=GREEDY)


def test_forced_tool_use_whole_and_streamed(client, forced):
    jsonschema = pytest.importorskip("jsonschema")
    assert forced.stop_reason == "tool_use" and [b.type for b in forced.content] == ["tool_use"]
    (use,) = forced.content
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER["input_schema"])

    # "any" with one tool forces the same call as naming it
    with client.messages.stream(model=ALIAS, max_tokens=64, messages=[QUESTION], tools=[WEATHER],
                                tool_choice={"type": "any"}, extra_body=GREEDY) as s:
        types = [(ev.type, getattr(ev, "content_block", None) and ev.content_block.type,
                  getattr(ev, "delta", None) and getattr(ev.delta, "type", None)) for ev in s]
        final = s.get_final_message()      # the client's own assembly of the input_json_delta events
    assert ("content_block_start", "tool_use", None) in types
    assert ("content_block_delta", None, "input_json_delta") in types
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
    assert (final.content[0].name, final.content[0].input) == (use.name, use.input)
    assert final.content[0].id.startswith("toolu_")
    assert final.usage.output_tokens == forced.usage.output_tokens


def _history(use, result, **extra):
    return [QUESTION, {"role": "assistant", "content": [use.model_dump()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": result, **extra}]}]


def test_tool_result_renders_as_openai_tool_message(server, client, forced):
    """The tool_use and tool_result render as the OpenAI endpoint's assistant tool_calls and tool
    message do, the result's text in the prompt; the reply is text."""
    (use,) = forced.content
    history = _history(use, "22 degrees and sunny")
    r = client.messages.create(model=ALIAS, max_tokens=4, messages=history, tools=[WEATHER],
                               extra_body=GREEDY)
    assert r.content[0].type == "text" and r.stop_reason in ("end_turn", "max_tokens")
    assert r.usage.input_tokens > forced.usage.input_tokens
    count = lambda h: client.messages.count_tokens(model=ALIAS, messages=h, tools=[WEATHER]).input_tokens  # noqa: E731
    assert count(history) == r.usage.input_tokens
    assert count(_history(use, [{"type": "text", "text": "22 degrees and sunny, windy"}])) > count(history)
    assert count(_history(use, "22 degrees and sunny", is_error=True)) > count(history)

    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=120, max_retries=0)
    tool = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                             "parameters": WEATHER["input_schema"]}}
    chat = oa.chat.completions.create(model=ALIAS, tools=[tool], max_tokens=4, temperature=0, messages=[
        QUESTION, {"role": "assistant", "content": None, "tool_calls": [{
            "id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "22 degrees and sunny"}])
    assert chat.usage.prompt_tokens == r.usage.input_tokens
    assert chat.choices[0].message.content == r.content[0].text


def test_bad_tools_are_400_in_anthropic_shape(client, forced):
    (use,) = forced.content
    bad = [dict(tools="get_weather"), dict(tools=[{"name": "f"}]),                # no input_schema
           dict(tools=[{"type": "bash_20250124", "name": "bash"}]), dict(tools=[WEATHER, WEATHER]),
           dict(tools=[{**WEATHER, "name": ""}]),
           dict(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}),
           dict(tools=[WEATHER], tool_choice={"type": "always"}), dict(tool_choice={"type": "any"}),
           dict(tools=[WEATHER], tool_choice="auto"),
           dict(messages=_history(use, "x")[:2] + [{"role": "user", "content": [
               {"type": "tool_result", "tool_use_id": "toolu_unknown", "content": "x"}]}]),
           dict(messages=_history(use, [{"type": "image", "source": {}}])),
           dict(messages=[QUESTION, {"role": "assistant", "content": [{"type": "tool_use", "id": "t",
                                                                       "name": "get_weather"}]}, QUESTION])]
    for kw in bad:
        kw.setdefault("messages", [QUESTION])
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model=ALIAS, max_tokens=4, **kw)
        _anthropic_error(e.value, 400, "invalid_request_error")
