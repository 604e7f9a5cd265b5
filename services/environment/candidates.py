"""Obtaining one candidate environment per capability: from the library, or written by an LLM.

Mode `library` (GENERATION_MODE_LIBRARY): pick the library family for the capability,
bundle it for the target (`library.bundle`) at its hardest level and validate it; while the
base agent finds it too hard (calibration below the band, nothing else failed), try the next
easier level (kit.py "Levels"). No LLM.

Mode `llm` (GENERATION_MODE_LLM): render prompts/environment/generate.md -- the capability,
its evidence and excerpts of the target's own trajectories (tool call / output pairs) as
delimited data blocks, the target's system prompt verbatim, its greeting, ALL of its tool
schemas, its record-toolkit contract when it has one, the SDK contract, and one reference
environment from the library -- ask the endpoint, extract the single ```python block, bind
the target's surface into it (`with_target`: TRACE appends `TARGET = {"surface": ...,
"toolkit_sha256": ...}`, as the library's bundles end), validate it in the sandbox; if it
is rejected, send the failed checks back (the prompt's feedback message) and try again, at
most `max_retries` more times. The reply is text until the sandbox worker executes it:
this module only parses it.

Trajectory excerpts (`target_excerpts`) come from `trajectories` when the caller passes the
target's own episodes (those of the evidence's task ids first); otherwise, for a target with
a record toolkit, from a few calls of the target's own tools on a world the toolkit builds
(the prompt says which).

Both return a `GenerationResult`: the final candidate's source, its validation report
(with the mode and every attempt recorded) and the attempts.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Any

from trace_common.env import Environment, Trajectory
from trace_common.env.surface import load_toolkit
from trace_common.errors import ContextExhausted, FailedPrecondition

from . import library
from .library.kit import REQUEST_MIX
from .sandbox.worker import ALLOWED_IMPORTS
from .targets import TargetInfo, resolve_target
from .validation import Check, ValidationConfig, ValidationReport

USER_SPLIT = "<!-- message: user -->"
FEEDBACK_SPLIT = "<!-- message: feedback -->"
_LEADING_COMMENT = re.compile(r"\A\s*<!--.*?-->\s*", re.S)
_FENCE = re.compile(r"```(?P<lang>[A-Za-z0-9_+-]*)[ \t]*\n(?P<body>.*?)(?:\n```|\Z)", re.S)

MODE_LIBRARY = "GENERATION_MODE_LIBRARY"
MODE_LLM = "GENERATION_MODE_LLM"

Validator = Callable[[str], Awaitable[ValidationReport]]


def default_prompt_path() -> Path:
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidate = base / "prompts" / "environment" / "generate.md"
        if candidate.is_file():
            return candidate
    return Path(__file__).resolve().parents[2] / "prompts" / "environment" / "generate.md"


@dataclass(frozen=True)
class GenerationPrompt:
    system: Template
    user: Template
    feedback: Template

    @staticmethod
    def _names(tpl: Template) -> set[str]:
        return {m.group("named") or m.group("braced") for m in tpl.pattern.finditer(tpl.template)
                if m.group("named") or m.group("braced")}

    def _render(self, tpl: Template, values: dict[str, Any], which: str) -> str:
        expected = self._names(tpl)
        missing = expected - values.keys()
        if missing:
            raise FailedPrecondition(f"prompt generate.md ({which}) uses {sorted(missing)} that the generation code "
                                     "does not provide; fix the template's $placeholders")
        text = {k: v if isinstance(v, str) else json.dumps(v, indent=2) for k, v in values.items() if k in expected}
        return tpl.substitute(text).strip()

    def initial(self, values: dict[str, Any]) -> list[dict[str, str]]:
        known = self._names(self.system) | self._names(self.user)
        extra = values.keys() - known
        if extra:
            raise FailedPrecondition(f"prompt generate.md has no placeholders for {sorted(extra)}; fix the template")
        return [{"role": "system", "content": self._render(self.system, values, "system")},
                {"role": "user", "content": self._render(self.user, values, "user")}]

    def feedback_message(self, values: dict[str, Any]) -> dict[str, str]:
        return {"role": "user", "content": self._render(self.feedback, values, "feedback")}


@lru_cache(maxsize=4)
def load_prompt(path: str | None = None) -> GenerationPrompt:
    file = Path(path) if path else default_prompt_path()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise FailedPrecondition(f"cannot read the generation prompt {file}: {exc}") from exc
    body = _LEADING_COMMENT.sub("", text, count=1)
    if body.count(USER_SPLIT) != 1 or body.count(FEEDBACK_SPLIT) != 1:
        raise FailedPrecondition(f"{file} must contain the lines {USER_SPLIT!r} and {FEEDBACK_SPLIT!r} once each")
    system, rest = body.split(USER_SPLIT)
    user, feedback = rest.split(FEEDBACK_SPLIT)
    return GenerationPrompt(Template(system), Template(user), Template(feedback))


def extract_module(reply: str) -> str | None:
    """The Python source in a reply: the longest ```python (or bare ```) block, else None."""
    blocks = [(m.group("lang").lower(), m.group("body")) for m in _FENCE.finditer(reply or "")]
    python = [b for lang, b in blocks if lang in ("python", "py", "python3")] or [b for lang, b in blocks if not lang]
    if not python:
        return None
    return max(python, key=len).strip("\n") + "\n"


def sdk_contract() -> str:
    return inspect.getdoc(Environment) or ""


def _encode_line(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True).replace("<", "\\u003c").replace(">", "\\u003e")


def encode_evidence(evidence: list[str]) -> str:
    """One JSON string per line, ASCII, no raw '<' or '>' (cannot close the data block)."""
    lines = [_encode_line(e) for e in evidence[:50]]
    return "\n".join(lines) or json.dumps("(no evidence given)")


#: Longest tool output quoted in an excerpt.
EXCERPT_OUTPUT_CHARS = 700


def _trajectory_pairs(traj: Trajectory) -> list[dict[str, Any]]:
    """{"task_id", "call", "output"} for each tool call of `traj` answered by a tool message."""
    answers = {m.tool_call_id: m.content or "" for m in traj.messages if m.role == "tool"}
    out = []
    for message in traj.messages:
        for call in message.tool_calls or []:
            if call.id in answers:
                out.append({"task_id": traj.task_id, "call": {"name": call.function.name,
                                                              "arguments": call.function.arguments},
                            "output": answers[call.id][:EXCERPT_OUTPUT_CHARS]})
    return out


def _toolkit_pairs(target: TargetInfo) -> list[dict[str, Any]]:
    """Calls of the target's own tools on a small world its record toolkit builds (seed 0)."""
    toolkit = load_toolkit(target.surface)
    world = toolkit.new_world(random.Random(0))
    user = toolkit.add_user(world)
    catalog = toolkit.products(world.db)
    orders = [toolkit.add_order(world, user.user_id, status, [(p.product_id, p.variants[0].item_id)])
              for status, p in (("pending", catalog[0]), ("delivered", catalog[1]))]
    db = toolkit.copy(world.db)
    pending, delivered = orders
    reason = toolkit.cancel_reasons[0]
    calls = [("find_user_id_by_email", {"email": user.email}), ("get_user_details", {"user_id": user.user_id}),
             ("list_user_orders", {"user_id": user.user_id}), ("get_order_details", {"order_id": delivered.order_id}),
             ("get_order_details", {"order_id": toolkit.loose_order_ids(pending.order_id)[0]}),
             ("cancel_pending_order", {"order_id": delivered.order_id, "reason": reason}),
             ("cancel_pending_order", {"order_id": pending.order_id,
                                       "reason": toolkit.reason_paraphrases[reason][0]}),
             ("cancel_pending_order", {"order_id": pending.order_id, "reason": reason})]
    names = set(target.tool_names())
    return [{"call": {"name": name, "arguments": json.dumps(args)},
             "output": toolkit.call(db, name, args).text[:EXCERPT_OUTPUT_CHARS]}
            for name, args in calls if name in names]


def target_excerpts(target: TargetInfo, trajectories: Sequence[Trajectory] | None, evidence: Sequence[str],
                    limit: int = 16) -> tuple[str, str]:
    """(where the excerpts come from, the encoded data lines): see the module docstring."""
    if trajectories:
        named = [t for t in trajectories if any(f"[{t.task_id}]" in e for e in evidence)]
        rest = [t for t in trajectories if all(t is not n for n in named)]
        pairs = [p for t in (*named, *rest) for p in _trajectory_pairs(t)][:limit]
        if pairs:
            return ("tool calls and the target's answers from the target's own episodes (the evidence's tasks "
                    "first)", "\n".join(_encode_line(p) for p in pairs))
    if target.surface.toolkit is not None:
        pairs = _toolkit_pairs(target)[:limit]
        return ("calls of the target's own tools on a small database its record toolkit built, with the target's "
                "answers (no episode of the target was given)", "\n".join(_encode_line(p) for p in pairs))
    return "no excerpts (no episode of the target was given and it has no record toolkit)", json.dumps("(none)")


def target_shape(target: TargetInfo) -> str:
    """What the prompt says about the shape of the target's conversations: the request mix the
    library measured on the target's train split (`library.kit.REQUEST_MIX`), or that none was."""
    mix = REQUEST_MIX.get(target.name)
    if mix is None:
        return (f"The shape of {target.name}'s conversations was not measured: read it from the excerpts (which "
                "kinds of request, how many per conversation, stated at once or one at a time).")
    def shares(d: dict[Any, float]) -> str:
        return ", ".join(f"{k} {v:.0%}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))
    return (f"Measured on {target.name}'s training tasks: requests per conversation {shares(mix['requests'])}; "
            f"request kinds {shares(mix['kinds'])}"
            + (" (a conversation never repeats a kind)" if mix.get("distinct") else "")
            + f"; every request stated in the first user message in {mix['all_at_once']:.0%} of the conversations "
            f"with several requests, one at a time otherwise; the expert takes {mix['turns']:.1f} agent turns on "
            "average.")


def reference_for(capability: str, target: TargetInfo) -> tuple[str, str, str]:
    """(family, target name, source for the prompt) of a library environment for *another* capability,
    bundled for `target` when it has a record toolkit, else for the built-in store; the baked TARGET
    constant is replaced by a note (TRACE binds it; it would only repeat the surface shown above)."""
    own = library.family_for(capability)
    family = next(f for f in ("precondition_verification", *library.FAMILIES) if f != own)
    ref_target = target if target.surface.toolkit is not None else resolve_target("store")
    source = library.bundle(family, ref_target.library_params(library.roles(family)))
    literal = library.target_literal(ref_target.library_params(library.roles(family)))
    note = ("import json\n\n# TARGET = json.loads(...): bound by TRACE at the end of the module -- the target's "
            "surface\n# ({'surface': {name, version, system_prompt, greeting, tool_schemas, toolkit, toolkit_params},"
            "\n#   'toolkit_sha256': ...}).\n")
    return family, ref_target.name, source.replace(literal, note)


def with_target(source: str, target: TargetInfo) -> str:
    """`source` with the target's surface bound at its end (`TARGET = ...`, as bundles end)."""
    return source.rstrip("\n") + "\n\n\n# ---- target surface bound by TRACE ----\n" + library.target_literal(
        target.baked())


def toolkit_section(target: TargetInfo) -> str:
    """What the prompt says about the target's record toolkit."""
    contract = target.toolkit_contract()
    if contract is None:
        return (f"{target.name} publishes no record toolkit: implement its tools yourself over your own seeded "
                "data, reproducing its tool outputs and errors exactly as the excerpts below show them.")
    line = library.toolkit_import(target.baked())
    return (f"{target.name} publishes a record toolkit: its own database schema and tool code. Use it for every "
            f"tool call, so each output is the target's own: import it with\n\n    {line}\n\n"
            f"build it once with `{library.TOOLKIT_NAME}(**TARGET['surface']['toolkit_params'])`, build each "
            "instance's world with it from `random.Random(seed)`, and answer each ToolAction with "
            "`toolkit.call(db, action.name, action.arguments).text` (an action whose `error` is set: "
            "`toolkit.invalid_arguments(action.name, action.error).text`).\n\n```text\n" + contract + "\n```")


@dataclass
class Attempt:
    index: int
    status: str
    reasons: list[str]
    sha256: str = ""
    chars: int = 0
    llm_seconds: float = 0.0
    validation_seconds: float = 0.0
    level: int | None = None                 # library mode: cases per instance (kit.py "Levels")
    calibration_episodes: int | None = None  # episodes this attempt's calibration played (0: none)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class GenerationResult:
    capability: str
    mode: str
    source: str
    report: ValidationReport
    attempts: list[Attempt] = field(default_factory=list)
    family: str | None = None
    extracted: bool = True


def _finish(report: ValidationReport, mode: str, attempts: list[Attempt]) -> ValidationReport:
    return report.model_copy(update={"mode": mode, "attempts": [a.to_dict() for a in attempts]})


def too_hard(report: ValidationReport) -> bool:
    """Rejected by calibration alone, below the band's top: an easier level may pass (a candidate
    that is too easy, or fails any other check, would fail the same way with fewer capability cases).
    Below the top also covers a mean inside the band with too few informative groups, and calibration
    episodes that failed (e.g. ran past the base model's context): an easier level keeps the
    conversation's requests and length but makes more of them plain, so 1s are likelier and the easier
    level is tried there too, its episodes counted like any attempt's."""
    failed = [c for c in report.checks if not c.passed]
    if report.status == "ACCEPTED" or [c.name for c in failed] != ["calibration"]:
        return False
    mean = report.numbers.get("calibration_mean")
    top = (report.config.get("band") or (0.2, 0.6))[1]
    return mean is not None and mean < float(top)


async def generate_library(capability: str, target: TargetInfo, validate: Validator) -> GenerationResult:
    """The family's levels, hardest first (kit.py "Levels"): validate each until one is accepted or
    a rejection that an easier level cannot fix (`too_hard` is false). Every attempt is recorded with
    its level and calibration episodes; the last one's source and report are the result."""
    family = library.require_family(capability)
    params = target.library_params(library.roles(family))
    attempts: list[Attempt] = []
    source, report = "", None
    for index, cases in enumerate(library.levels(family), start=1):
        source = library.bundle(family, params, cases=cases)
        t0 = time.perf_counter()
        report = await validate(source)
        attempts.append(Attempt(index, report.status, report.reasons, hashlib.sha256(source.encode()).hexdigest(),
                                len(source), validation_seconds=round(time.perf_counter() - t0, 3), level=cases,
                                calibration_episodes=report.calibration_episodes()))
        if not too_hard(report):
            break
    assert report is not None
    return GenerationResult(capability, MODE_LIBRARY, source, _finish(report, MODE_LIBRARY, attempts), attempts,
                            family=family)


def _no_code_report(reply: str, target: TargetInfo, config: ValidationConfig) -> ValidationReport:
    reason = ("the reply contains no ```python code block" if reply.strip()
              else "the reply was empty")
    return ValidationReport(status="REJECTED", reasons=[f"extract: {reason}"],
                            checks=[Check(name="extract", passed=False, reason=reason)],
                            candidate={"chars": 0}, target=target.summary(), config=config.model_dump(mode="json"))


def _too_long_report(detail: str, target: TargetInfo, config: ValidationConfig) -> ValidationReport:
    reason = (f"the generation prompt does not fit the generator's context ({detail[:300]}); it carries the "
              f"target's system prompt and its {len(target.tool_schemas)} tool schemas: use a generator model with a "
              "longer context")
    return ValidationReport(status="REJECTED", reasons=[f"generate: {reason}"],
                            checks=[Check(name="generate", passed=False, reason=reason)],
                            candidate={"chars": 0}, target=target.summary(), config=config.model_dump(mode="json"))


async def generate_llm(capability: dict[str, Any], target: TargetInfo, client: Any, validate: Validator,
                       config: ValidationConfig, *, max_retries: int, prompt: GenerationPrompt | None = None,
                       max_tokens: int | None = None, temperature: float = 0.2, seed: int | None = None,
                       trajectories: Sequence[Trajectory] | None = None) -> GenerationResult:
    """The generate -> validate -> feedback loop (see module docstring).

    `capability`: {name, description, evidence}; `client`: a `trace_common.llm.ChatClient`;
    `trajectories`: the target's own episodes to quote tool calls from (optional).
    """
    prompt = prompt or load_prompt()
    name = capability["name"]
    ref_name, ref_target, ref_source = reference_for(name, target)
    evidence = list(capability.get("evidence") or [])
    excerpt_source, excerpts = target_excerpts(target, trajectories, evidence)
    greeting = (f"After the system prompt the conversation opens with the assistant greeting {target.greeting!r} "
                "(an assistant message), then the user's first message." if target.greeting else
                "After the system prompt the conversation opens with the user's first message (no greeting).")
    values = {
        "capability_name": name, "capability_description": capability.get("description") or "(no description)",
        "nonce": secrets.token_hex(8), "evidence": encode_evidence(evidence),
        "excerpt_source": excerpt_source, "excerpts": excerpts, "target_shape": target_shape(target),
        "target_name": target.name, "tool_count": str(len(target.tool_schemas)),
        "tool_schemas": json.dumps(target.tool_schemas, indent=1), "system_prompt": target.system_prompt,
        "greeting_rule": greeting, "toolkit_section": toolkit_section(target),
        "max_addendum": str(config.max_addendum_chars),
        "sdk_contract": sdk_contract(), "allowed_imports": ", ".join(ALLOWED_IMPORTS),
        "noop_max": f"{config.noop_max_mean:g}", "random_max": f"{config.random_max_mean:g}",
        "band_low": f"{config.band[0]:g}", "band_high": f"{config.band[1]:g}",
        "reference_name": ref_name, "reference_target": ref_target, "reference_source": ref_source,
    }
    messages = prompt.initial(values)
    attempts: list[Attempt] = []
    source, report, extracted = "", None, False
    total = max_retries + 1
    for index in range(1, total + 1):
        t0 = time.perf_counter()
        try:
            result = await client.complete(messages, temperature=temperature, max_tokens=max_tokens, seed=seed)
        except ContextExhausted as err:   # this candidate's prompt (target prompt, tools, evidence) is too long
            report = _too_long_report(str(err), target, config)
            attempts.append(Attempt(index, report.status, report.reasons, llm_seconds=round(time.perf_counter() - t0, 3)))
            break
        llm_s = round(time.perf_counter() - t0, 3)
        reply = result.content or ""
        code = extract_module(reply)
        t1 = time.perf_counter()
        if code is None:
            report = _no_code_report(reply, target, config)
            source, extracted = reply, False
        else:
            source, extracted = with_target(code, target), True
            report = await validate(source)
        attempts.append(Attempt(index, report.status, report.reasons, hashlib.sha256(source.encode()).hexdigest(),
                                len(source), llm_s, round(time.perf_counter() - t1, 3),
                                calibration_episodes=report.calibration_episodes()))
        if report.status == "ACCEPTED" or index == total:
            break
        numbers = ", ".join(f"{k} {v:.2f}" for k, v in report.numbers.items()) or "none (stopped early)"
        messages += [{"role": "assistant", "content": reply},
                     prompt.feedback_message({"attempt": str(index), "max_attempts": str(total),
                                              "reasons": "\n".join(f"- {r}" for r in report.reasons),
                                              "numbers": numbers})]
    assert report is not None
    return GenerationResult(name, MODE_LLM, source, _finish(report, MODE_LLM, attempts), attempts,
                            family=library.family_for(name), extracted=extracted)


__all__ = ["GenerationPrompt", "GenerationResult", "MODE_LIBRARY", "MODE_LLM", "extract_module",
           "generate_library", "generate_llm", "load_prompt", "target_excerpts", "with_target"]
