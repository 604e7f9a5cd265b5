"""Policies that validation and calibration play against a candidate environment.

- `noop_policy`: one message that does nothing ("I'm sorry, I can't help with that.").
  An environment whose reward does not depend on the agent's actions shows up here.
- `RandomPolicy(seed)`: seeded random tool calls with arguments drawn from what the
  conversation has shown so far (ids, emails and words from user and tool messages, enum
  values from the schemas), ending with a random message with probability 1/4 per turn.
  It is the blind-but-busy baseline: it can hit a lookup by luck, it cannot plan.
- `ScriptedSkillFactory(p)`: the scripted stand-in for the base policy in calibration.
  Sample k of a seed is "skilled" for a stratified fraction p of the samples (`draw`)
  and then plays the module's `solve(seed)` (the oracle) or `solve_unskilled(seed)` (the
  module's own model of an agent without the skill; the no-op when it has none). It
  mirrors the store expert's partial gaps; it is recorded as `scripted:skill-mixture@p`
  in every report (and `scripted_stand_in: true` in `calibration_policy_info`, with the
  reason it played) so nobody mistakes it for a model. The real base agent plugs in through
  the same factory shape (`for_episode(env, seed, sample_index, sampling_seed) -> async
  policy`, `info`, `close()`, the rollout service's `PolicyFactory` shape): see
  calibration_policy.py.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from typing import Any

from trace_common.env import Message, PolicyInfo, ToolCall

NOOP_TEXT = "I'm sorry, I can't help with that."
_TOKEN = re.compile(r"[#\w@.\-]+")


def action_message(action: dict[str, Any], index: int) -> Message:
    """An assistant message performing one action dict ({name, arguments} or {message})."""
    if "message" in action:
        return Message.assistant(str(action["message"]))
    return Message.assistant(None, [ToolCall.create(f"call_{index}", str(action["name"]),
                                                    dict(action.get("arguments") or {}))])


class ActionScript:
    """A sync+async policy replaying a fixed list of actions, then a closing message."""

    def __init__(self, actions: list[dict[str, Any]]):
        self.actions = list(actions)
        self.index = 0

    def next(self) -> Message:
        if self.index < len(self.actions):
            msg = action_message(self.actions[self.index], self.index)
        else:
            msg = Message.assistant("That is all I can do.")
        self.index += 1
        return msg

    def __call__(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        return self.next()

    async def async_call(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        return self.next()


def noop_policy(messages: list[Message], tools: list[dict[str, Any]]) -> Message:
    return Message.assistant(NOOP_TEXT)


class RandomPolicy:
    """Seeded random tool calls (see module docstring)."""

    def __init__(self, seed: int, p_message: float = 0.25):
        self.rng = random.Random(seed)
        self.p_message = p_message
        self.calls = 0

    @staticmethod
    def _pool(messages: list[Message]) -> list[str]:
        seen: dict[str, None] = {}
        for m in messages:
            if m.role in ("user", "tool") and m.content:
                for token in _TOKEN.findall(m.content):
                    seen.setdefault(token.strip(".,"), None)
        return [t for t in seen if t] or ["x"]

    def _value(self, spec: dict[str, Any], pool: list[str]) -> Any:
        if "enum" in spec and spec["enum"]:
            return self.rng.choice(list(spec["enum"]))
        kind = spec.get("type", "string")
        if kind == "array":
            return [self._value(spec.get("items") or {"type": "string"}, pool)]
        if kind in ("integer", "number"):
            return self.rng.randint(0, 100)
        if kind == "boolean":
            return self.rng.random() < 0.5
        return self.rng.choice(pool)

    def __call__(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        pool = self._pool(messages)
        if not tools or self.rng.random() < self.p_message:
            words = [self.rng.choice(pool) for _ in range(self.rng.randint(1, 8))]
            return Message.assistant(" ".join(words))
        fn = self.rng.choice(tools)["function"]
        props = (fn.get("parameters") or {}).get("properties") or {}
        args = {name: self._value(spec, pool) for name, spec in props.items()}
        self.calls += 1
        return Message.assistant(None, [ToolCall.create(f"call_{self.calls}", fn["name"], args)])


def draw(seed: int, sample_index: int, p: float) -> bool:
    """Whether sample `sample_index` of `seed` shows the skill: stratified, so any run of
    consecutive samples of one seed has the skilled fraction p to within one sample.

    Semantics:
        u = a fixed pseudo-random offset in [0, 1) from the seed
        skilled(k) = floor((k + 1) * p + u) > floor(k * p + u)
    """
    digest = hashlib.sha256(f"skill:{seed}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return math.floor((sample_index + 1) * p + u) > math.floor(sample_index * p + u)


class ScriptedSkillFactory:
    """Calibration stand-in for the base policy (see module docstring)."""

    def __init__(self, p: float, note: str = "requested: SCRIPTED skill-mixture calibration policy"):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"skill probability {p} is not in [0, 1]")
        self.p = p
        self.note = note
        self.info = PolicyInfo(model=f"scripted:skill-mixture@{p:g}")

    def describe(self) -> dict[str, Any]:
        """The validation report's record: always flagged as the scripted stand-in, with why it played."""
        return {"backend": "POLICY_BACKEND_SCRIPTED", "model": f"skill-mixture@{self.p:g}",
                "scripted_stand_in": True, "note": self.note}

    def for_episode(self, env: Any, seed: int, sample_index: int, sampling_seed: int):
        skilled = draw(seed, sample_index, self.p)
        actions = env.solve(seed) if skilled else env.solve_unskilled(seed)
        if actions is None:  # the module models no skill-less agent: fall back to doing nothing
            actions = [{"message": NOOP_TEXT}]
        return ActionScript(actions).async_call

    async def close(self) -> None:
        return None
