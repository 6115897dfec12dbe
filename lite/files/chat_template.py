"""Chat templates: the Jinja2 templates GGUF files carry (`tokenizer.chat_template`), rendered the
way Hugging Face transformers and llama-cpp-python render them, plus built-in templates for files
that carry none; and the split of a rendered conversation into the template's markup and the
messages' contents, so that a content's text never becomes a control token (chat_spans).
"""
import json
import re
import uuid
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lite.errors import LiteError


class ChatTemplateError(LiteError):
    """A chat template that fails to parse or render, or one that raised on the messages."""


# ChatML: what llama.cpp falls back to for a model without a template of its own.
CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Gemma, as llama.cpp's built-in "gemma" template: no system role, so system text (trimmed) goes
# at the top of the next user turn; "assistant" is spelled "model"; contents are trimmed. No BOS:
# encode() adds it.
GEMMA = (
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set ns.system = ns.system + (message['content'] | trim) -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' -}}"
    "{%- if ns.system and role != 'model' -%}"
    "{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}"
    "{%- endif -%}"
    "{{- (message['content'] | trim) + '<end_of_turn>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

_BUILTIN = {"gemma": GEMMA, "gemma2": GEMMA, "gemma3": GEMMA, "gemma3n": GEMMA}


def builtin_template(architecture):
    """The template to use when a file has none: Gemma's for gemma architectures, else ChatML."""
    return _BUILTIN.get(architecture or "", CHATML)


def _raise_exception(message):
    raise ChatTemplateError(f"chat template: {message}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers renders tojson without escaping non-ASCII and without HTML escaping
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


_CACHE = {}


def _compile(template):
    compiled = _CACHE.get(template)
    if compiled is None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            compiled = env.from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template does not parse (line {e.lineno}): {e}") from e
        if len(_CACHE) > 16:
            _CACHE.clear()
        _CACHE[template] = compiled
    return compiled


def render_chat(template, messages, add_generation_prompt=True, bos_token="", eos_token="",
                **extra):
    """Render `messages` (a list of {"role", "content"} dicts) with a Jinja2 chat template in a
    sandbox, with the variables transformers passes (`messages`, `add_generation_prompt`,
    `bos_token`, `eos_token`, `raise_exception`, `strftime_now`) plus any `extra` ones (`tools`,
    `enable_thinking`, ...)."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ChatTemplateError(f"message {i} must be a dict with 'role' and 'content'")
    try:
        return _compile(template).render(messages=messages,
                                         add_generation_prompt=add_generation_prompt,
                                         bos_token=bos_token, eos_token=eos_token, **extra)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template failed to render: {e}") from e


def chat_spans(template, messages, add_generation_prompt, spells_control, whole=False, **variables):
    """Render `messages` as (text, parse_special) spans that join to render_chat's text: the
    template's markup parsed for special tokens, the message contents (as the template placed
    them) not. Found by rendering once more with a unique sentinel for each string content; a
    template that trims or cuts a content is matched by the longest spans that are pieces of the
    contents. Where the two renderings do not line up (a template that branches on a content),
    the text is one parsed span, allowed only when no content spells a control token.
    `spells_control(text)`: the tokenizer's test; whole: one span, unchecked (for display)."""
    text = render_chat(template, messages, add_generation_prompt, **variables)
    for i, m in enumerate(messages):
        if not whole and spells_control(str(m["role"])):
            raise ChatTemplateError(f"messages[{i}].role spells a control token")
    spans = None if whole else _split(text, template, messages, add_generation_prompt, variables)
    if spans is not None:
        return spans
    for i, m in enumerate(messages):
        if not whole and isinstance(m.get("content"), str) and spells_control(m["content"]):
            raise ChatTemplateError(f"messages[{i}] spells a control token, and this chat template "
                                    "changes contents too much to keep it text")
    return [(text, True)]


def _split(text, template, messages, add_generation_prompt, variables):
    nonce = uuid.uuid4().hex
    masked = [dict(m, content=f"\ue000{nonce}:{i}\ue001") if isinstance(m.get("content"), str) else m
              for i, m in enumerate(messages)]
    try:
        shape = render_chat(template, masked, add_generation_prompt, **variables)
    except ChatTemplateError:
        return None
    pieces = re.split(f"\ue000{nonce}:(\\d+)\ue001", shape)
    markup, contents = pieces[0::2], [messages[int(i)]["content"] for i in pieces[1::2]]
    found = _line_up(text, markup, contents)
    if found is None:
        return None
    spans, pos = [], 0
    for start, end in found:
        spans += [(text[pos:start], True), (text[start:end], False)]
        pos = end
    spans.append((text[pos:], True))
    return [s for s in spans if s[0]]


def _line_up(text, markup, contents):
    """(start, end) of each content slot in text = markup[0] + c0 + markup[1] + ... + markup[-1],
    each slot's text a substring of its content; the content as it is first, then the longest
    piece (a span too long only turns markup into text, never text into markup)."""
    failed = set()

    def solve(j, pos):
        if j == len(contents):
            return [] if pos == len(text) else None
        if (j, pos) in failed:
            return None
        content, after = contents[j], markup[j + 1]
        ends = [pos + len(content)] if text.startswith(content, pos) else []
        end = min(len(text), pos + len(content))
        while end >= pos:
            end = text.rfind(after, pos, end + len(after))
            if end < 0:
                break
            if text[pos:end] in content:
                ends.append(end)
            end -= 1
        for end in ends:
            if text.startswith(after, end):
                rest = solve(j + 1, end + len(after))
                if rest is not None:
                    return [(pos, end)] + rest
        failed.add((j, pos))
        return None

    return solve(0, len(markup[0])) if text.startswith(markup[0]) else None
