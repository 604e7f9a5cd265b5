"""Obtaining one candidate environment per capability: from the library, or written by an LLM.

Mode `library` (GENERATION_MODE_LIBRARY): pick the library family for the capability,
bundle it for the target (`library.bundle`), validate it once. No LLM.

Mode `llm` (GENERATION_MODE_LLM): render prompts/environment/generate.md (capability,
evidence as a delimited data block, the target's tool schemas, system-prompt format and
policy excerpt, the SDK contract, one reference environment from the library), ask the
endpoint, extract the single ```python block, validate it in the sandbox; if it is
rejected, send the failed checks back (the prompt's feedback message) and try again, at
most `max_retries` more times. The reply is text until the sandbox worker executes it:
this module only parses it.

Both return a `GenerationResult`: the final candidate's source, its validation report
(with the mode and every attempt recorded) and the attempts.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Any

from trace_common.env import Environment
from trace_common.errors import FailedPrecondition

from . import library
from .sandbox.worker import ALLOWED_IMPORTS
from .targets import PROFILES, TargetInfo, resolve_target
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


def encode_evidence(evidence: list[str]) -> str:
    """One JSON string per line, ASCII, no raw '<' or '>' (cannot close the data block)."""
    lines = [json.dumps(e, ensure_ascii=True).replace("<", "\\u003c").replace(">", "\\u003e") for e in evidence[:50]]
    return "\n".join(lines) or json.dumps("(no evidence given)")


def reference_for(capability: str, target: TargetInfo) -> tuple[str, str]:
    """(name, bundled source) of a library environment for *another* capability."""
    own = library.family_for(capability)
    family = next(f for f in ("precondition_verification", *library.FAMILIES) if f != own)
    ref_target = target if target.profile is not None else resolve_target("store")
    return family, library.bundle(family, ref_target.library_params(library.roles(family)))


@dataclass
class Attempt:
    index: int
    status: str
    reasons: list[str]
    sha256: str = ""
    chars: int = 0
    llm_seconds: float = 0.0
    validation_seconds: float = 0.0

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


async def generate_library(capability: str, target: TargetInfo, validate: Validator) -> GenerationResult:
    family = library.require_family(capability)
    source = library.bundle(family, target.library_params(library.roles(family)))
    t0 = time.perf_counter()
    report = await validate(source)
    attempt = Attempt(1, report.status, report.reasons, hashlib.sha256(source.encode()).hexdigest(), len(source),
                      validation_seconds=round(time.perf_counter() - t0, 3))
    return GenerationResult(capability, MODE_LIBRARY, source, _finish(report, MODE_LIBRARY, [attempt]), [attempt],
                            family=family)


def _no_code_report(reply: str, target: TargetInfo, config: ValidationConfig) -> ValidationReport:
    reason = ("the reply contains no ```python code block" if reply.strip()
              else "the reply was empty")
    return ValidationReport(status="REJECTED", reasons=[f"extract: {reason}"],
                            checks=[Check(name="extract", passed=False, reason=reason)],
                            candidate={"chars": 0}, target=target.summary(), config=config.model_dump(mode="json"))


async def generate_llm(capability: dict[str, Any], target: TargetInfo, client: Any, validate: Validator,
                       config: ValidationConfig, *, max_retries: int, prompt: GenerationPrompt | None = None,
                       max_tokens: int | None = None, temperature: float = 0.2,
                       seed: int | None = None) -> GenerationResult:
    """The generate -> validate -> feedback loop (see module docstring).

    `capability`: {name, description, evidence}; `client`: a `trace_common.llm.ChatClient`.
    """
    prompt = prompt or load_prompt()
    name = capability["name"]
    ref_name, ref_source = reference_for(name, target)
    values = {
        "capability_name": name, "capability_description": capability.get("description") or "(no description)",
        "nonce": secrets.token_hex(8), "evidence": encode_evidence(list(capability.get("evidence") or [])),
        "target_name": target.name, "tool_schemas": json.dumps(target.tool_schemas, indent=1),
        "system_prompt_format": target.system_prompt_format(), "policy_excerpt": target.policy_excerpt(),
        "sdk_contract": sdk_contract(), "allowed_imports": ", ".join(ALLOWED_IMPORTS),
        "min_tools": str(config.min_tools), "max_tools": str(config.max_tools),
        "noop_max": f"{config.noop_max_mean:g}", "random_max": f"{config.random_max_mean:g}",
        "band_low": f"{config.band[0]:g}", "band_high": f"{config.band[1]:g}",
        "reference_name": ref_name, "reference_source": ref_source,
    }
    messages = prompt.initial(values)
    attempts: list[Attempt] = []
    source, report, extracted = "", None, False
    total = max_retries + 1
    for index in range(1, total + 1):
        t0 = time.perf_counter()
        result = await client.complete(messages, temperature=temperature, max_tokens=max_tokens, seed=seed)
        llm_s = round(time.perf_counter() - t0, 3)
        reply = result.content or ""
        code = extract_module(reply)
        t1 = time.perf_counter()
        if code is None:
            report = _no_code_report(reply, target, config)
            source, extracted = reply, False
        else:
            source, extracted = code, True
            report = await validate(code)
        attempts.append(Attempt(index, report.status, report.reasons, hashlib.sha256(source.encode()).hexdigest(),
                                len(source), llm_s, round(time.perf_counter() - t1, 3)))
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


def known_library_targets() -> list[str]:
    return sorted(PROFILES)


__all__ = ["GenerationPrompt", "GenerationResult", "MODE_LIBRARY", "MODE_LLM", "extract_module",
           "generate_library", "generate_llm", "known_library_targets", "load_prompt"]
