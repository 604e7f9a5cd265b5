"""Markdown prompt templates (prompts/analysis/*.md) and the data blocks that carry trajectories.

A prompt file is markdown rendered with `string.Template` (`$name` placeholders, `$$` for a
literal dollar). A line `<!-- message: user -->` splits it into the system message (above) and
the user message (below); an HTML comment opening the file documents its variables and is
dropped. Rendering is strict: a missing or unknown variable is an error, so a prompt and the
code that fills it cannot drift apart silently.

Trajectory text is untrusted. It only ever reaches a prompt inside a data block:

    <<<TRACE_DATA kind=trajectory nonce=<random hex>>>
    {"ref": ..., "task_id": ..., "messages": [...]}         <- compaction.encode_view, one line
    <<<END_TRACE_DATA nonce=<random hex>>>

The payload is JSON with ASCII escapes and `<`/`>` escaped as `\\u003c`/`\\u003e`, so it has no
raw newline and can contain neither marker; the nonce is fresh per request, so text inside a
trajectory cannot guess it either. The prompt tells the model that the block is data.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Any

from trace_common.errors import FailedPrecondition

from .compaction import encode_view

USER_SPLIT = "<!-- message: user -->"
_LEADING_COMMENT = re.compile(r"\A\s*<!--.*?-->\s*", re.S)
PROMPT_NAMES = ("discover", "label")


def default_prompts_dir() -> Path:
    """prompts/analysis next to the working directory (the image's /app) or the source tree."""
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidate = base / "prompts" / "analysis"
        if candidate.is_dir():
            return candidate
    return Path(__file__).resolve().parents[2] / "prompts" / "analysis"


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    system: Template
    user: Template

    def variables(self) -> set[str]:
        names: set[str] = set()
        for tpl in (self.system, self.user):
            for m in tpl.pattern.finditer(tpl.template):
                if m.group("named") or m.group("braced"):
                    names.add(m.group("named") or m.group("braced"))
        return names

    def render(self, **values: Any) -> list[dict[str, str]]:
        """[system, user] chat messages. Raises FailedPrecondition on a variable mismatch."""
        expected = self.variables()
        missing, extra = expected - values.keys(), values.keys() - expected
        if missing or extra:
            raise FailedPrecondition(f"prompt {self.name}.md and the analysis code disagree: missing values "
                                     f"{sorted(missing)}, unused values {sorted(extra)}; fix the template's "
                                     "$placeholders")
        text = {k: v if isinstance(v, str) else json.dumps(v, indent=2) for k, v in values.items()}
        return [{"role": "system", "content": self.system.substitute(text).strip()},
                {"role": "user", "content": self.user.substitute(text).strip()}]


def parse_template(name: str, text: str) -> PromptTemplate:
    body = _LEADING_COMMENT.sub("", text, count=1)
    if body.count(USER_SPLIT) != 1:
        raise FailedPrecondition(f"prompt {name}.md must contain the line {USER_SPLIT!r} exactly once "
                                 "(it separates the system message from the user message)")
    system, user = body.split(USER_SPLIT)
    return PromptTemplate(name, Template(system), Template(user))


@lru_cache(maxsize=16)  # templates are read once per process: restart to pick up edits
def load_template(prompts_dir: Path, name: str) -> PromptTemplate:
    path = Path(prompts_dir) / f"{name}.md"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise FailedPrecondition(f"analysis prompt {path} cannot be read ({err.strerror}); set "
                                 "TRACE_ANALYSIS_PROMPTS_DIR to the directory holding discover.md and "
                                 "label.md") from None
    return parse_template(name, text)


def new_nonce() -> str:
    return secrets.token_hex(8)


def encode_data(view: dict[str, Any]) -> str:
    """`encode_view` with `<` and `>` escaped: the payload can never contain a block marker."""
    return encode_view(view).replace("<", "\\u003c").replace(">", "\\u003e")


def data_block(view: dict[str, Any], nonce: str, kind: str = "trajectory") -> str:
    return (f"<<<TRACE_DATA kind={kind} nonce={nonce}>>>\n{encode_data(view)}\n"
            f"<<<END_TRACE_DATA nonce={nonce}>>>")
