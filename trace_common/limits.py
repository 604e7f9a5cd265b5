"""Request size caps, one per field class, shared by every service's request specs.

No client can exhaust a service (docs/design.md, "Trust boundaries"): besides the gRPC message cap
(`max_message_bytes`) and the pending-job caps (trace_common/jobs.py), each field of a request spec
that a client fills with text or lists has a cap for its class, stated in the protos' comments and
enforced while the spec validates, so a refusal is INVALID_ARGUMENT naming the field, the cap and the
fix, before any job exists. Each cap is far above what the repo's own configs and tests send: the
longest real system prompt (a tau2 policy with its instructions) is under 20,000 characters, the
demo evaluates 500 tasks by split and limit, tau2's task lists hold at most 114 ids of 3 characters,
the longest store URI the stages write is under 200 characters, and the pipeline passes at most 10 evidence quotes and 100 failed task ids per capability.

The checks run before pydantic's own validation of the field (`BeforeValidator`), so an oversized
list is refused without validating each of its items.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

#: A prompt: a rollout's system prompt (characters).
PROMPT_CHARS = 65_536
#: Free text written by a person or an analyst: a capability's description, one evidence quote.
TEXT_CHARS = 16_384
#: One identifier: a task id, a split name, an environment parameter's name, a registry name or
#: version, an adapter/composition/profile name, a served model name (characters).
ID_CHARS = 256
#: One URI or reference: an artifact or data URI, a model/adapter/composition reference (a store URI,
#: a path under an operator's model root, a built-in agent name), an endpoint URL (characters). Linux's
#: PATH_MAX is 4096, so no path a service could open is longer.
URI_CHARS = 4096
#: A list of task ids (entries): a rollout's task_ids, a capability's failed_task_ids.
TASK_IDS = 10_000
#: Evidence quotes of one capability (entries).
EVIDENCE_ITEMS = 50
#: An environment's parameters (entries), and one parameter's value (characters).
PARAMS = 64
PARAM_VALUE_CHARS = 16_384
#: Job labels (entries) and one label's value (characters); keys match [a-z][a-z0-9_.-]{0,62}.
LABELS = 16
LABEL_VALUE_CHARS = 256
#: A Create…Job request's request_id (characters).
REQUEST_ID_CHARS = 128


def _text(cap: int, what: str, fix: str):
    def check(value: Any) -> Any:
        if isinstance(value, str) and len(value) > cap:
            raise ValueError(f"{len(value)} characters, over the cap of {cap} for {what}; {fix}")
        return value
    return BeforeValidator(check)


def _entries(cap: int, what: str, fix: str):
    def check(value: Any) -> Any:
        if isinstance(value, (list, tuple, dict)) and len(value) > cap:
            raise ValueError(f"{len(value)} entries, over the cap of {cap} for {what}; {fix}")
        return value
    return BeforeValidator(check)


#: Field types carrying the caps (use them as a spec field's annotation).
Prompt = Annotated[str, _text(PROMPT_CHARS, "a prompt", "shorten it, or leave it empty for the environment's "
                                                          "own system prompt")]
FreeText = Annotated[str, _text(TEXT_CHARS, "free text", "shorten it (one paragraph or quote)")]
Identifier = Annotated[str, _text(ID_CHARS, "an identifier", "use the id or name as the service lists it")]
UriRef = Annotated[str, _text(URI_CHARS, "a URI or reference", "name the artifact by its store URI, or the model "
                                                                 "by a path under an operator model root")]
TaskIds = Annotated[list[Identifier], _entries(TASK_IDS, "a task id list", "split the tasks over several jobs, "
                                                                           "or select them by split and limit")]
EvidenceList = Annotated[list[FreeText], _entries(EVIDENCE_ITEMS, "evidence quotes", "keep the most telling ones")]
ParamValue = Annotated[str, _text(PARAM_VALUE_CHARS, "a parameter value", "pass large data by URI, not inline")]
ParamName = Annotated[str, _text(ID_CHARS, "a parameter name", "use a parameter name the environment takes")]
Params = Annotated[dict[ParamName, ParamValue], _entries(PARAMS, "environment parameters",
                                                          "drop parameters the environment does not take")]
