"""Chat templates: the Jinja2 templates GGUF files carry (`tokenizer.chat_template`), rendered the
way Hugging Face transformers and llama-cpp-python render them, plus built-in templates for files
that carry none.
"""
import json
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
