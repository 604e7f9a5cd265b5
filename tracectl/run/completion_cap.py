"""The run's one completion cap: the most tokens of one assistant turn, in every stage (issue 31).

Calibration measures whether the base agent can learn an environment; training then samples the
same policy. If the two capped a turn differently (the demo once capped training and the gates at
96 tokens, calibration and evaluation at 256), the episodes calibration measured are not the ones
training plays, and a turn the target needs may not fit at all. So one cap is derived from the
target and passed to every stage: the base rollouts and every evaluation arm (RolloutSpec
sampling.max_tokens), calibration (GenerationSpec.calibration_sampling.max_tokens), adapter and
gate training (max_completion_length of their configs).

Semantics (derived; `max_completion_length: {tokens, reason}` in the run config replaces it):
    play the target's scripted expert (`expert:perfect`, the rollout service's) on EXPERT_TASKS
        tasks of the target's train split, one episode each       # the target's own reference turns
    render each episode with the base agent's chat template and count, per assistant reply, the
        base agent's tokens from the generation prompt to its end-of-turn marker included
        (what the policy must generate: the warm start's loss spans, trace_common/agents/sft.py)
    longest = max over all replies
    cap = longest + max(MIN_MARGIN, ceil(MARGIN * longest))      # room for a reply a little longer
                                                                  # than the expert's own
The expert's episodes are the target's reference solutions, not a method's: no budget counts them
(GRPO on the target plays with the same cap). Derivation needs a target with a scripted expert
(the built-in store) and a base agent whose tokenizer tracectl can read (a built-in agent or a
local model directory); for any other run the config must set the cap, with its reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_common.env import Trajectory
from trace_common.errors import InvalidArgument
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.run.results import CompletionCap

#: Target training tasks the expert plays to find the longest reply.
EXPERT_TASKS = 200
#: The margin over the longest expert reply: a quarter of it, at least 16 tokens.
MARGIN, MIN_MARGIN = 0.25, 16
#: Targets whose scripted expert the rollout service plays (services/rollout/policies.py check_scripted).
EXPERT_TARGETS = ("store",)
OVERRIDE = ("set the cap in the run config, once, with its reason: max_completion_length: {tokens: N, reason: "
            "'...'} (a value that fits the target's longest assistant turn in the base agent's tokens)")


def margin(longest: int) -> int:
    return max(MIN_MARGIN, math.ceil(MARGIN * longest))


def reply_lengths(tokenizer: Any, trajectories: Sequence[Trajectory]) -> list[int]:
    """Tokens of every assistant reply (its generation, end-of-turn marker included) as the base
    agent's chat template renders the conversations (module docstring)."""
    from trace_common.policy.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    out: list[int] = []
    for traj in trajectories:
        text, spans = chat.assistant_spans(traj.messages, traj.tools)
        if not spans:
            continue
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        for lo, hi in spans:
            out.append(sum(1 for a, b in offsets if b > a and lo <= a and b <= hi))
    return out


def base_tokenizer(cfg) -> Any:
    """The base agent's tokenizer, or InvalidArgument saying to set the cap by hand."""
    b = cfg.base_agent
    if b.backend == "http":
        raise InvalidArgument(field="max_completion_length", expected="the cap of a served base agent, whose "
                              "tokenizer tracectl cannot read", fix=OVERRIDE)
    from transformers import AutoTokenizer

    from trace_common.agents.resolve import BUILT_IN, resolve_base_agent

    if b.name in BUILT_IN:
        directory = resolve_base_agent(b.name)
    else:
        directory = Path(b.name.removeprefix("file://")).expanduser()
        if not (directory / "tokenizer_config.json").is_file() and not (directory / "tokenizer.json").is_file():
            raise InvalidArgument(field="max_completion_length", expected=f"a base agent whose tokenizer tracectl can "
                                  f"read (base_agent.name {b.name!r} is no local model directory here)", fix=OVERRIDE)
    return AutoTokenizer.from_pretrained(directory)


def derive(p) -> CompletionCap:
    """The run's cap and how it was reached (module docstring); `p` is the Pipeline."""
    cfg = p.cfg
    if cfg.max_completion_length is not None:
        return CompletionCap(tokens=cfg.max_completion_length.tokens, source="config",
                             reason=cfg.max_completion_length.reason)
    if cfg.target.env not in EXPERT_TARGETS:
        raise InvalidArgument(field="max_completion_length", expected=f"a target with a scripted expert to derive it "
                              f"from ({', '.join(EXPERT_TARGETS)}); {cfg.target.env!r} has none", fix=OVERRIDE)
    tokenizer = base_tokenizer(cfg)
    expert = t.PolicyRef(backend=t.POLICY_BACKEND_SCRIPTED, model="expert:perfect")
    res = p.rollout(expert, "train", EXPERT_TASKS, 1, 0.0, "expert turns (completion cap)", max_tokens=0)
    from tracectl.evaluation.scoring import read_trajectories

    lengths = reply_lengths(tokenizer, read_trajectories(p.store, res.uri))
    if not lengths:
        raise InvalidArgument(field="max_completion_length", expected="expert episodes with assistant replies",
                              reason=f"the expert's {res.episodes} episodes have none", fix=OVERRIDE)
    longest = max(lengths)
    return CompletionCap(tokens=longest + margin(longest), source="derived", longest_expert_turn=longest,
                         margin=margin(longest), expert_episodes=res.episodes, expert_replies=len(lengths),
                         expert_job=res.job, expert_trajectories=res.uri, tokenizer=cfg.base_agent.name)
