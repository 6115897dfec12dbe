"""Anthropic tool use without a model: a Messages request's tools, tool_choice, tool_use and
tool_result blocks as the OpenAI chat request tool_calls.py renders, and the reply's text and
tool_use blocks, whole and as Anthropic's stream events assembled back, for the event sequences
tool_calls.ToolCallStream emits."""
import asyncio
import json

import pytest

from lite.server.anthropic_protocol import MessageReply, chat_body
from lite.server.openai_protocol import RequestError
from lite.server.tool_calls import new_call

WEATHER = {"name": "get_weather", "description": "The weather of a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
PARIS = {"city": "Paris"}
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": PARIS}


def test_request_as_openai_chat():
    body = chat_body({"system": "Be brief.", "tools": [WEATHER], "tool_choice": {"type": "any"},
                      "messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, USE,
                                          {**USE, "id": "toolu_2", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "22 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no "}, {"type": "text", "text": "data"}]},
            {"type": "text", "text": "And tomorrow?"}]}]})
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather of a city", "parameters": WEATHER["input_schema"]}}]
    assert body["tool_choice"] == "required"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": PARIS}},
            {"id": "toolu_2", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "22 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no data"},
        {"role": "user", "content": "And tomorrow?"}]


@pytest.mark.parametrize("choice,openai", [
    ({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}})])
def test_tool_choice_as_openai(choice, openai):
    body = chat_body({"tools": [WEATHER], "tool_choice": choice, "messages": [{"role": "user", "content": "x"}]})
    assert body["tool_choice"] == openai


@pytest.mark.parametrize("body", [
    {"tools": {"name": "f"}}, {"tools": [{"name": "f", "input_schema": "x"}]},
    {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
    {"tools": [WEATHER, WEATHER]}, {"tools": [{**WEATHER, "description": 3}]},
    {"tools": [WEATHER], "tool_choice": "any"}, {"tools": [WEATHER], "tool_choice": {"type": "tool"}},
    {"tools": [WEATHER], "tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}},
    {"tool_choice": {"type": "tool", "name": "get_weather"}},
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}]},
    {"messages": [{"role": "assistant", "content": [{**USE, "input": "{}"}]}, {"role": "user", "content": "x"}]},
    {"messages": [{"role": "assistant", "content": [USE]}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "image"}]}]}]},
    {"messages": [{"role": "user", "content": [USE]}]},
])
def test_bad_tool_fields_are_400(body):
    with pytest.raises(RequestError) as e:
        chat_body({"messages": [{"role": "user", "content": "x"}], **body})
    assert e.value.status == 400 and e.value.type == "invalid_request_error"


FINISH = {"usage": {"completion_tokens": 7}, "timings": {}}
CALL = new_call("get_weather", PARIS)
ODD = new_call("get_weather", "not json")            # a call whose arguments are no JSON object


def streamed(events, single=False):
    """Run MessageReply.stream over the events and assemble its blocks as a client does."""
    async def run():
        q = asyncio.Queue()
        for ev in events:
            q.put_nowait(ev)
        return [f async for f in MessageReply("m", 3, single).stream(q)]
    frames = [(f.split("\n")[0].removeprefix("event: "), json.loads(f.split("\n")[1].removeprefix("data: ")))
              for f in asyncio.run(run())]
    blocks, open_, delta = [], None, None
    for name, data in frames:
        assert data["type"] == name
        if name == "content_block_start":
            assert open_ is None and data["index"] == len(blocks)
            open_, partial = dict(data["content_block"]), ""
            assert open_.get("input", {}) == {} and open_.get("text", "") == ""
        elif name == "content_block_delta":
            assert data["index"] == len(blocks)
            d = data["delta"]
            if d["type"] == "text_delta":
                open_["text"] += d["text"]
            else:
                assert d["type"] == "input_json_delta" and open_["type"] == "tool_use"
                partial += d["partial_json"]
        elif name == "content_block_stop":
            if open_["type"] == "tool_use":
                open_["input"] = json.loads(partial)
            blocks.append(open_)
            open_ = None
        elif name == "message_delta":
            delta = data["delta"]["stop_reason"]
    assert open_ is None and frames[-1][0] == "message_stop"
    return blocks, delta


@pytest.mark.parametrize("events,kinds,reason", [
    ([{"text": "Sunny."}, {"finish": "stop"}], ["text"], "end_turn"),
    ([{"text": "\n"}, {"tool_calls": [CALL]}, {"finish": "tool_calls"}], ["tool_use"], "tool_use"),
    ([{"text": "Let me "}, {"text": "look."}, {"tool_calls": [CALL, {**CALL, "id": "call_2"}]},
      {"finish": "tool_calls"}], ["text", "tool_use", "tool_use"], "tool_use"),
    ([{"tool_calls": [CALL]}, {"finish": "length"}], ["tool_use"], "max_tokens"),
    ([{"tool_calls": [ODD]}, {"finish": "tool_calls"}], ["text"], "end_turn"),
    ([{"finish": "stop"}], ["text"], "end_turn"),
])
def test_stream_assembles_to_the_whole_message(events, kinds, reason):
    blocks, stop = streamed([{**ev, **FINISH} if "finish" in ev else ev for ev in events])
    text = "".join(ev.get("text", "") for ev in events)
    calls = [c for ev in events for c in ev.get("tool_calls", [])]
    whole = MessageReply("m", 3).whole(text, {"finish": events[-1]["finish"], **FINISH}, calls)
    assert [b["type"] for b in whole["content"]] == kinds and whole["stop_reason"] == reason == stop
    assert blocks == whole["content"]
    for b in blocks:
        if b["type"] == "tool_use":
            assert b["id"].startswith("toolu_") and (b["name"], b["input"]) == ("get_weather", PARIS)
    if calls and calls[0] is ODD:                       # given back as the text the model wrote
        assert '"not json"' in blocks[0]["text"]


def test_disable_parallel_tool_use_keeps_the_first_call():
    second = new_call("get_weather", {"city": "Rome"})
    whole = MessageReply("m", 3, single=True).whole("", {"finish": "tool_calls", **FINISH}, [CALL, second])
    assert [b["input"] for b in whole["content"]] == [PARIS]
    blocks, _ = streamed([{"tool_calls": [CALL, second]}, {"finish": "tool_calls", **FINISH}], single=True)
    assert blocks == whole["content"]
    assert len(MessageReply("m", 3).whole("", {"finish": "tool_calls", **FINISH}, [CALL, second])["content"]) == 2


def test_empty_user_content_is_an_empty_turn():
    assert chat_body({"messages": [{"role": "user", "content": []}]})["messages"] == [{"role": "user", "content": ""}]
