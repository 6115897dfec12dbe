"""Constrained decoding (lite/server/grammar.py): the mask on SmolLM2's real tokenizer, walked with
random allowed tokens (no model), always spells what the grammar describes; then `lite serve` with
the official openai client: json_object output parses, json_schema output validates against its
schema at temperature 0.8, a Lark or GBNF grammar and a regex constrain the text to their language,
a bad schema or grammar is a 400 naming its field, and tool_choice forces a tool call whose
arguments validate against the tool's parameters, whole and streamed, and whose result renders."""
import json
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from conftest import real_model  # noqa: E402
from lite.server.grammar import closed_objects, json_grammar, make_constraint, request_grammar  # noqa: E402
from lite.server.openai_protocol import RequestError  # noqa: E402

CAT = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 30},
    "color": {"enum": ["black", "white", "orange"]}}, "required": ["name", "age", "color"]}
SCHEMAS = [  # (prompt, schema): every string and array bounded, so each reply ends in a few tokens
    ("Describe a cat.", CAT),
    ("Is water wet? Answer in JSON.", {"type": "object", "properties": {"answer": {"type": "boolean"}},
                                        "required": ["answer"]}),
    ("Pick a primary colour.", {"type": "object", "properties": {
        "colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"]}),
    ("List two small numbers.", {"type": "object", "properties": {"numbers": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2, "maxItems": 2}}, "required": ["numbers"]}),
    ("Give a city and its country.", {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10}, "country": {"type": "string", "maxLength": 10}},
        "required": ["city", "country"]}),
    ("Rate this movie from 1 to 5.", {"type": "object", "properties": {
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "liked": {"type": "boolean"}}, "required": ["stars", "liked"]}),
    ("A point in the plane.", {"type": "object", "properties": {"point": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                         "y": {"type": "integer", "minimum": -9, "maximum": 9}},
        "required": ["x", "y"]}}, "required": ["point"]}),
    ("Today's weather?", {"type": "object", "properties": {
        "sky": {"enum": ["sunny", "cloudy", "rainy"]}, "warm": {"type": "boolean"}},
        "required": ["sky", "warm"]}),
    ("Say a short word.", {"type": "object", "required": ["word"],
                           "properties": {"word": {"type": "string", "pattern": "^[a-z]{1,6}$"}}}),
    ("A to-do item.", {"type": "object", "properties": {
        "task": {"type": "string", "maxLength": 12},
        "priority": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 3}, {"type": "null"}]}},
        "required": ["task", "priority"]}),
]


@pytest.fixture(scope="module")
def tok():
    from lite.files.gguf_file import GGUFFile
    from lite.files.tokenizer import Tokenizer
    return Tokenizer.from_metadata(GGUFFile(real_model("smollm2")).metadata)


def random_walk(tok, grammar_text, seed, limit=200):
    """Draw random tokens among the allowed ones until the grammar is complete (or takes an EOG)."""
    c, rng, out = make_constraint(tok, grammar_text, "grammar"), np.random.default_rng(seed), []
    for _ in range(limit):
        allowed = np.flatnonzero(np.isfinite(c.mask(np.zeros(tok.n_vocab, np.float32))))
        t = int(rng.choice(allowed))
        if t in tok.eog_ids:
            break
        assert c.advance(t), c.error
        out.append(t)
        if c.done:
            break
    return tok.decode(out)


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_masked_random_tokens_spell_valid_json(tok, i):
    text = random_walk(tok, json_grammar(SCHEMAS[i][1], "response_format"), seed=i)
    jsonschema.validate(json.loads(text), SCHEMAS[i][1])


def test_masked_random_tokens_spell_the_grammar_language(tok):
    for seed in range(5):
        assert re.fullmatch(r"[0-9]{3}-[a-c]+!", random_walk(tok, request_grammar(
            {"grammar": 'root ::= [0-9]{3} "-" [a-c]+ "!"'})[0], seed))


def test_mask_covers_padded_logit_rows(tok):
    c = make_constraint(tok, request_grammar({"regex": "a"})[0], "regex")
    masked = c.mask(np.zeros(tok.n_vocab + 64, np.float32))
    assert masked.shape == (tok.n_vocab + 64,) and not np.isfinite(masked[tok.n_vocab:]).any()
    assert np.isfinite(masked).sum() >= 1 and np.isfinite(masked[tok.encode("a", add_special=False)[0]])


def test_closed_objects_only_closes_listed_properties():
    s = closed_objects({"type": "object", "properties": {"a": {"type": "object", "properties": {}},
                                                         "b": {"type": "object"}},
                        "anyOf": [{"properties": {"c": {}}, "additionalProperties": True}]})
    assert s["additionalProperties"] is False and s["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in s["properties"]["b"] and s["anyOf"][0]["additionalProperties"]


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": []}}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}, "grammar"),
    ({"grammar": ""}, "grammar"),
    ({"regex": 5}, "regex"),
])
def test_bad_grammar_fields_are_400(body, param):
    with pytest.raises(RequestError) as e:
        request_grammar(body)
    assert e.value.status == 400 and e.value.param == param


# --- end to end: `lite serve` and the openai client -------------------------------------------
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
from live_server import running  # noqa: E402

ALIAS = "smol"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"]}}}


@pytest.fixture(scope="module")
def server():
    with running(real_model("smollm2"), "-np", "4", "-c", "512", "--alias", ALIAS) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300, max_retries=0)


def chat(client, content, max_tokens=48, **kw):
    return client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": content}],
                                          max_tokens=max_tokens, **kw).choices[0]


def test_json_object_parses(client):
    c = chat(client, "What is 2+2? Answer in JSON.", response_format={"type": "json_object"}, temperature=0)
    assert c.finish_reason == "stop" and isinstance(json.loads(c.message.content), dict)


def test_json_schema_output_validates(client):
    def one(i):
        prompt, schema = SCHEMAS[i]
        return chat(client, prompt, temperature=0.8, seed=i, response_format={
            "type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    with ThreadPoolExecutor(4) as pool:
        for (_, schema), c in zip(SCHEMAS, pool.map(one, range(len(SCHEMAS)))):
            assert c.finish_reason == "stop"
            jsonschema.validate(json.loads(c.message.content), schema)


@pytest.mark.parametrize("grammar", ['root ::= ("yes" | "no") "."', 'start: ("yes" | "no") "."'],
                         ids=["gbnf", "lark"])
def test_grammar_constrains_the_reply(client, grammar):
    c = chat(client, "Is the sky blue?", temperature=0.8, extra_body={"grammar": grammar})
    assert c.message.content in ("yes.", "no.") and c.finish_reason == "stop"


def test_regex_on_completions(client):
    r = client.completions.create(model=ALIAS, prompt="The year was", max_tokens=8, temperature=0.8,
                                  extra_body={"regex": " [12][0-9]{3}"})
    assert re.fullmatch(" [12][0-9]{3}", r.choices[0].text) and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kw,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"extra_body": {"grammar": "start: undefined_rule"}}, "grammar"),
    ({"extra_body": {"regex": "[unclosed"}}, "regex"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
])
def test_invalid_grammar_is_400_in_openai_shape(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "x", **kw)
    assert e.value.status_code == 400 and e.value.body["param"] == param
    assert e.value.body["type"] == "invalid_request_error" and e.value.body["message"]


def test_forced_tool_call_round_trip(client):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    c = client.chat.completions.create(model=ALIAS, messages=[question], tools=[WEATHER],
                                       tool_choice="required", max_tokens=64, temperature=0.8).choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    # the result goes back as a tool message, after the assistant message carrying the call
    history = [question, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "22 degrees and sunny"}]
    r = client.chat.completions.create(model=ALIAS, messages=history, tools=[WEATHER], max_tokens=4,
                                       temperature=0)
    bare = client.chat.completions.create(model=ALIAS, messages=[question], tools=[WEATHER],
                                          max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > bare.usage.prompt_tokens


def test_named_tool_call_streams_as_deltas(client):
    stream = client.chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "Weather in Rome, in fahrenheit?"}],
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64, temperature=0.8, stream=True)
    deltas, finish = [], None
    for ch in stream:
        if ch.choices:
            deltas += ch.choices[0].delta.tool_calls or []
            assert not ch.choices[0].delta.content
            finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    head, rest = deltas[0], deltas[1:]
    assert head.index == 0 and head.id.startswith("call_") and head.type == "function"
    assert head.function.name == "get_weather" and all(d.index == 0 and d.id is None for d in rest)
    args = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
