"""Chat formatting: OpenAI messages + tool schemas -> the prompt text a causal LM continues.

Three cases, chosen per tokenizer (`ChatFormat.mode`):

- `template`: the tokenizer's chat template renders tools and tool calls itself (it
  mentions `tools`, as Qwen's and TRACE's templates do). Messages are passed with each
  call's arguments decoded to a dict when possible (what HF templates expect).
- `hermes`: the template knows nothing of tools (SmolLM2's plain ChatML one, many others).
  The tools are described in the system prompt in a Hermes/Qwen-style `<tools>` block,
  assistant calls become `<tool_call>{...}</tool_call>` text, and tool results are passed
  with role `tool` (or, for templates that reject that role, as a user message wrapped in
  `<tool_response>` tags).
- a tokenizer without any chat template gets `TRACE_CHATML_TEMPLATE`.

`TRACE_CHATML_TEMPLATE` is the template of TRACE's own base agents (`micro`, and the
converted `smollm2`): ChatML with a compact one-line-per-tool signature list (a
few-million-parameter model is trained on it, so the prompt stays short) and calls rendered
as `<tool_call>{"name": ..., "arguments": ...}</tool_call>` with the arguments string
verbatim, which is exactly what `parse_assistant_text` reads back.

`ChatFormat.assistant_spans` gives, for a whole conversation, the character spans of each
assistant reply in the rendered text (up to and including the end-of-turn marker): the
warm-start trainer puts its loss on exactly the tokens a policy generates at rollout time.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any, Literal

from jinja2.exceptions import TemplateError

from trace_common.env.messages import Message
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.policy.toolcalls import render_assistant_text

TRACE_CHATML_TEMPLATE = (
    # Every literal is a {{ '...' }} expression, so Jinja's whitespace trimming never eats a newline.
    r"{%- macro render_tools(tools) -%}"
    r"{{- '<tools>\n' -}}"
    r"{%- for tool in tools -%}"
    r"{%- set f = tool.function if tool.function is defined else tool -%}"
    r"{%- set ps = f.parameters if f.parameters is defined else {} -%}"
    r"{%- set req = ps.required if ps.required is defined else [] -%}"
    r"{{- f.name ~ '(' -}}"
    r"{%- if ps.properties is defined -%}{%- for pname, p in ps.properties.items() -%}"
    r"{{- pname ~ ('' if pname in req else '?') ~ ': ' -}}"
    r"{%- if p.enum is defined -%}{{- p.enum | map('tojson') | join('|') -}}"
    r"{%- elif p.type == 'array' and p['items'] is defined and p['items'].type is defined -%}"
    r"{{- '[' ~ p['items'].type ~ ']' -}}"
    r"{%- elif p.type is defined -%}{{- p.type -}}{%- else -%}{{- 'any' -}}{%- endif -%}"
    r"{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}"
    r"{%- endfor -%}{%- endif -%}"
    r"{{- '): ' ~ (f.description if f.description is defined else '') ~ '\n' -}}"
    r"{%- endfor -%}"
    r"{{- '</tools>' -}}"
    r"{%- endmacro -%}"
    r"{%- if messages and messages[0].role == 'system' -%}"
    r"{{- '<|im_start|>system\n' ~ messages[0].content -}}"
    r"{%- if tools -%}{{- '\n' ~ render_tools(tools) -}}{%- endif -%}"
    r"{{- '<|im_end|>\n' -}}"
    r"{%- set rest = messages[1:] -%}"
    r"{%- else -%}"
    r"{%- if tools -%}{{- '<|im_start|>system\n' ~ render_tools(tools) ~ '<|im_end|>\n' -}}{%- endif -%}"
    r"{%- set rest = messages -%}"
    r"{%- endif -%}"
    r"{%- for m in rest -%}"
    r"{%- if m.role == 'assistant' -%}"
    r"{{- '<|im_start|>assistant\n' -}}"
    r"{%- if m.content -%}{{- m.content -}}{%- endif -%}"
    r"{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}"
    r"{%- set fn = tc.function if tc.function is defined else tc -%}"
    r"{%- if m.content or not loop.first -%}{{- '\n' -}}{%- endif -%}"
    r"{{- '<tool_call>{\"name\": ' ~ (fn.name | tojson) ~ ', \"arguments\": ' -}}"
    r"{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    r"{{- '}</tool_call>' -}}"
    r"{%- endfor -%}{%- endif -%}"
    r"{{- '<|im_end|>\n' -}}"
    r"{%- else -%}"
    r"{{- '<|im_start|>' ~ m.role ~ '\n' ~ (m.content if m.content is not none else '') ~ '<|im_end|>\n' -}}"
    r"{%- endif -%}"
    r"{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)

Mode = Literal["auto", "template", "hermes"]

HERMES_TOOLS_INTRO = (
    "You can call the functions listed below. Their signatures are JSON schemas inside "
    "<tools></tools> tags, one per line:\n<tools>\n{schemas}\n</tools>\n"
    "To call a function, reply with one JSON object inside <tool_call></tool_call> tags:\n"
    "<tool_call>{{\"name\": <function name>, \"arguments\": <JSON object of arguments>}}</tool_call>"
)


def _template_source(tokenizer: Any) -> str | None:
    tmpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tmpl, dict):  # several named templates: the default one
        tmpl = tmpl.get("default") or next(iter(tmpl.values()), None)
    return tmpl if isinstance(tmpl, str) and tmpl.strip() else None


def _decoded_arguments(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


class ChatFormat:
    """Renders conversations for one tokenizer (see the module docstring for the modes).

    `mode="auto"` picks `template` when the tokenizer's chat template mentions `tools`,
    otherwise `hermes`; a tokenizer with no template uses `TRACE_CHATML_TEMPLATE`
    (mode `template`).
    """

    def __init__(self, tokenizer: Any, mode: Mode = "auto"):
        if mode not in ("auto", "template", "hermes"):
            raise InvalidArgument(field="mode", expected="'auto', 'template' or 'hermes'", got=mode)
        self.tokenizer = tokenizer
        source = _template_source(tokenizer)
        self.template = source or TRACE_CHATML_TEMPLATE
        if mode == "auto":
            mode = "template" if "tools" in self.template else "hermes"
        self.mode: Literal["template", "hermes"] = mode
        self._tool_role = "tool"  # hermes mode; switched to "user" if the template rejects it

    # -- message preparation ----------------------------------------------------------------
    def _template_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        out = []
        for m in messages:
            d = m.to_dict()
            if m.tool_calls:
                d["tool_calls"] = [{"id": tc.id, "type": "function",
                                    "function": {"name": tc.function.name,
                                                 "arguments": _decoded_arguments(tc.function.arguments)}}
                                   for tc in m.tool_calls]
            out.append(d)
        return out

    def _hermes_messages(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None
                         ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        block = None
        if tools:
            block = HERMES_TOOLS_INTRO.format(schemas="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        for m in messages:
            if m.role == "assistant":
                out.append({"role": "assistant", "content": render_assistant_text(m)})
            elif m.role == "tool":
                if self._tool_role == "tool":
                    out.append({"role": "tool", "content": m.content or ""})
                else:
                    out.append({"role": "user",
                                "content": f"<tool_response>\n{m.content or ''}\n</tool_response>"})
            else:
                out.append({"role": m.role, "content": m.content or ""})
        if block is not None:
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
            else:
                out.insert(0, {"role": "system", "content": block})
        return out

    # -- rendering --------------------------------------------------------------------------
    def render(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None, *,
               add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` (plus the assistant header when
        `add_generation_prompt`)."""
        tools = list(tools) if tools else None
        if self.mode == "template":
            return self._apply(self._template_messages(messages), tools, add_generation_prompt)
        try:
            return self._apply(self._hermes_messages(messages, tools), None, add_generation_prompt)
        except TemplateError:
            if self._tool_role == "user" or not any(m.role == "tool" for m in messages):
                raise
            self._tool_role = "user"
            return self._apply(self._hermes_messages(messages, tools), None, add_generation_prompt)

    def _apply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               add_generation_prompt: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools, chat_template=self.template,
                                                      add_generation_prompt=add_generation_prompt,
                                                      tokenize=False)
        except TemplateError:
            raise
        except (TypeError, ValueError, KeyError) as exc:
            raise FailedPrecondition(f"the chat template of this tokenizer cannot render the conversation "
                                     f"({type(exc).__name__}: {exc}); use a model whose template accepts "
                                     "system/user/assistant/tool messages") from exc
        if not isinstance(text, str):
            raise FailedPrecondition("apply_chat_template(tokenize=False) did not return text")
        return text

    def assistant_spans(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
                        ) -> tuple[str, list[tuple[int, int]]]:
        """(full text, [(start, end) char span of each assistant reply]).

        A span starts where the generation prompt for that turn ends and stops at the end of
        the reply's end-of-turn marker (what the model must generate, stop token included).
        Raises FailedPrecondition when the template does not render conversations
        incrementally (a prefix of the conversation must render to a prefix of the text).
        """
        full = self.render(messages, tools, add_generation_prompt=False)
        eos = self.eos_text()
        spans: list[tuple[int, int]] = []
        for i, m in enumerate(messages):
            if m.role != "assistant":
                continue
            prompt = self.render(messages[:i], tools, add_generation_prompt=True)
            upto = self.render(messages[: i + 1], tools, add_generation_prompt=False)
            if not full.startswith(upto) or not upto.startswith(prompt):
                raise FailedPrecondition(
                    f"the chat template does not render message {i} as a continuation of the messages "
                    "before it; warm start needs a template that renders conversations incrementally")
            end = len(upto)
            if eos and eos in upto[len(prompt):]:
                end = upto.index(eos, len(prompt)) + len(eos)
            spans.append((len(prompt), end))
        return full, spans

    def eos_text(self) -> str | None:
        """The end-of-turn marker: `<|im_end|>` for ChatML templates, else the eos token."""
        if "<|im_end|>" in self.template:
            return "<|im_end|>"
        return getattr(self.tokenizer, "eos_token", None)


def render_template_text(template: str, messages: Sequence[Message | dict[str, Any]],
                         tools: Sequence[dict[str, Any]] | None = None, *, add_generation_prompt: bool = False) -> str:
    """Render a chat template without a tokenizer (same Jinja settings as transformers:
    sandboxed, trim_blocks, lstrip_blocks, a `tojson` that does not escape HTML). Used to
    build the corpus a new tokenizer is trained on."""
    dicts = [m.to_dict() if isinstance(m, Message) else dict(m) for m in messages]
    for d in dicts:
        for tc in d.get("tool_calls") or []:
            tc["function"] = dict(tc["function"], arguments=_decoded_arguments(tc["function"]["arguments"]))
    return _compiled(template).render(messages=dicts, tools=list(tools) if tools else None,
                                            add_generation_prompt=add_generation_prompt)


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    return env.from_string(template)
