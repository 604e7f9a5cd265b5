"""Scripted expert for the store domain, with planted, partial capability gaps.

The embedded default's base agents are warm-started by imitating this expert, so its gaps
become the base agent's gaps, which TRACE must then rediscover and repair. A gap is
*partial*: for each capability the config gives the probability that the expert shows the
skill in an episode (drawn per episode from a seeded generator), so the imitating policy
varies between rollouts and GRPO groups carry signal.

What the expert does without each skill (and only in the task type that tests it):

| capability                 | without the skill                                                          |
|----------------------------|-----------------------------------------------------------------------------|
| structured_data_reasoning  | picks the first listed order holding the named product with an allowed status, ignoring the options -> a look-alike order (wrong_record) |
| multi_step_task_completion | handles only the first of several requests stated at once, then reports (subrequest_unaddressed) |
| precondition_verification  | cancels without looking the order up; a non-pending order is refused by the tool, too late (write_precondition_false) |
| tool_call_precision        | copies the user's loose order id / reason paraphrase into the call, gets an error and gives up (malformed_argument) |

With every skill at 1.0 the expert solves every task. The expert reads the task (its gold
facts) to plan, but every decision it makes is also determined by what the agent sees
(user messages and tool results), so a policy imitating it can learn the same behaviour.

Semantics (default gaps, test split): pass rate ≈ mean over types of
    record_selection: p_s;  multi_request: 0.2 + 0.8·p_m;  precondition_check: 0.4 + 0.6·p_p;
    argument_format: p_t
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trace_common.domains.store.env import StoreEnv
from trace_common.domains.store.tasks import CAPABILITIES, SubRequest, Task
from trace_common.domains.store.world import item_label, money
from trace_common.env.episode import run_episode
from trace_common.env.messages import Message, ToolCall
from trace_common.env.trajectory import PolicyInfo, Trajectory

DEFAULT_SKILLS: dict[str, float] = {
    "structured_data_reasoning": 0.25,
    "multi_step_task_completion": 0.25,
    "precondition_verification": 0.25,
    "tool_call_precision": 0.25,
}


class ExpertConfig(BaseModel):
    """Gap configuration of the scripted expert."""

    model_config = ConfigDict(extra="forbid")

    skills: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_SKILLS),
        description="Capability -> probability in [0, 1] that the expert shows the skill in an episode. "
                    "Capabilities left out are fully present (1.0).")
    seed: int = Field(default=0, ge=0, description="Seed of the per-episode skill draws.")

    @field_validator("skills")
    @classmethod
    def _check_skills(cls, skills: dict[str, float]) -> dict[str, float]:
        for name, p in skills.items():
            if name not in CAPABILITIES:
                raise ValueError(f"unknown capability {name!r}: use one of {', '.join(CAPABILITIES)}")
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"skills[{name!r}] = {p} is not a probability: give a value in [0, 1]")
        return {c: float(skills.get(c, 1.0)) for c in CAPABILITIES}

    @classmethod
    def perfect(cls, seed: int = 0) -> ExpertConfig:
        return cls(skills={c: 1.0 for c in CAPABILITIES}, seed=seed)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(), sort_keys=True).encode()).hexdigest()[:12]


class _Plan:
    """Builds the expert's assistant messages for one episode."""

    def __init__(self, task: Task):
        self.task = task
        self.messages: list[Message] = []

    def call(self, name: str, **arguments: Any) -> None:
        call_id = f"call_{len(self.messages)}"
        self.messages.append(Message.assistant(None, [ToolCall.create(call_id, name, arguments)]))

    def say(self, text: str) -> None:
        self.messages.append(Message.assistant(text))

    def order(self, order_id: str) -> dict[str, Any]:
        return self.task.db["orders"][order_id]


def _outcome_sentence(plan: _Plan, sr: SubRequest, order_id: str, item_id: str | None = None) -> str:
    if sr.kind == "address":
        return f"Your address is now {sr.facts['address']}."
    order = plan.order(order_id)
    pm = order["payment_method_id"]
    if sr.kind == "cancel":
        total = sum(r["price"] for r in order["items"])
        return f"Order {order_id} is cancelled; refund {money(total)} to {pm}."
    if sr.kind == "return":
        row = next(r for r in order["items"] if r["item_id"] == item_id)
        return f"Return of the {row['name']} from order {order_id} is requested; refund {money(row['price'])} to {pm}."
    if sr.kind == "status":
        return f"Order {order_id} is {order['status']}."
    raise AssertionError(sr.kind)


def _do_subrequest(plan: _Plan, sr: SubRequest, skills: dict[str, bool]) -> str:
    """Tool calls for one by-id sub-request (ids canonical); returns the report sentence."""
    task = plan.task
    if sr.kind == "address":
        plan.call("modify_user_address", user_id=task.user_id, address=sr.facts["address"])
        return _outcome_sentence(plan, sr, "")
    assert sr.order_id is not None
    if sr.kind == "cancel":
        if skills["precondition_verification"]:
            plan.call("get_order_details", order_id=sr.order_id)
        plan.call("cancel_pending_order", order_id=sr.order_id, reason=sr.facts["reason"])
        return _outcome_sentence(plan, sr, sr.order_id)
    plan.call("get_order_details", order_id=sr.order_id)
    if sr.kind == "return":
        plan.call("return_delivered_order_items", order_id=sr.order_id, item_ids=[sr.facts["item_id"]],
                  payment_method_id=plan.order(sr.order_id)["payment_method_id"])
        return _outcome_sentence(plan, sr, sr.order_id, sr.facts["item_id"])
    return _outcome_sentence(plan, sr, sr.order_id)  # status


def _record_selection(plan: _Plan, skills: dict[str, bool]) -> None:
    sr = plan.task.subrequests[0]
    plan.call("list_user_orders", user_id=plan.task.user_id)
    f = sr.facts
    order_id, item_id = ((sr.order_id, f["item_id"]) if skills["structured_data_reasoning"]
                         else (f["decoy_order_id"], f["decoy_item_id"]))
    assert order_id is not None
    if sr.kind == "address":
        return f"Your address is now {sr.facts['address']}."
    order = plan.order(order_id)
    pm = order["payment_method_id"]
    if sr.kind == "cancel":
        plan.call("cancel_pending_order", order_id=order_id, reason=f["reason"])
        plan.say(_outcome_sentence(plan, sr, order_id))
    elif sr.kind == "return":
        plan.call("return_delivered_order_items", order_id=order_id, item_ids=[item_id], payment_method_id=pm)
        plan.say(_outcome_sentence(plan, sr, order_id, item_id))
    else:
        product = plan.task.db["products"][f["product_id"]]
        new = product["variants"][f["new_item_id"]]
        old = next(r for r in order["items"] if r["item_id"] == item_id)
        plan.call("get_product_details", product_id=f["product_id"])
        plan.call("exchange_delivered_order_items", order_id=order_id, item_ids=[item_id],
                  new_item_ids=[f["new_item_id"]], payment_method_id=pm)
        diff = new["price"] - old["price"]
        direction = "charged to" if diff >= 0 else "refunded to"
        plan.say(f"Exchange of the {item_label(old['name'], old['options'])} for "
                 f"({', '.join(new['options'])}) in order {order_id} is requested; "
                 f"price difference {money(abs(diff))} {direction} {pm}.")


def _multi_request(plan: _Plan, skills: dict[str, bool]) -> None:
    task = plan.task
    sequential = task.scenario.mode == "sequential"
    todo = task.subrequests if (skills["multi_step_task_completion"] or sequential) else task.subrequests[:1]
    sentences = []
    for sr in todo:
        sentence = _do_subrequest(plan, sr, skills)
        if sequential:
            plan.say(sentence)
        else:
            sentences.append(sentence)
    if not sequential:
        plan.say(" ".join(sentences))


def _precondition_check(plan: _Plan, skills: dict[str, bool]) -> None:
    sr = plan.task.subrequests[0]
    assert sr.order_id is not None
    status = plan.order(sr.order_id)["status"]
    if skills["precondition_verification"]:
        plan.call("get_order_details", order_id=sr.order_id)
        if status == "pending":
            plan.call("cancel_pending_order", order_id=sr.order_id, reason=sr.facts["reason"])
    else:
        plan.call("cancel_pending_order", order_id=sr.order_id, reason=sr.facts["reason"])
    if status == "pending":
        plan.say(_outcome_sentence(plan, sr, sr.order_id))
    else:
        plan.say(f"Order {sr.order_id} is {status}, so it cannot be cancelled; only pending orders can be.")


def _argument_format(plan: _Plan, skills: dict[str, bool]) -> None:
    sr = plan.task.subrequests[0]
    if skills["tool_call_precision"]:
        plan.say(_do_subrequest(plan, sr, skills))
        return
    raw_id = sr.facts["raw_order_ref"]
    raw_ok = raw_id == sr.order_id  # the user happened to write the id canonically
    if sr.kind == "cancel" and (raw_ok or not skills["precondition_verification"]):
        if skills["precondition_verification"]:
            plan.call("get_order_details", order_id=raw_id)
        plan.call("cancel_pending_order", order_id=raw_id, reason=sr.facts["raw_reason"])
    else:
        plan.call("get_order_details", order_id=raw_id)
    plan.say(f"Sorry, I could not process your order {raw_id}.")


_TYPE_PLANNERS = {
    "record_selection": _record_selection,
    "multi_request": _multi_request,
    "precondition_check": _precondition_check,
    "argument_format": _argument_format,
}


class StoreExpert:
    """Plays store episodes as a scripted expert with the configured gaps."""

    def __init__(self, config: ExpertConfig | None = None):
        self.config = config or ExpertConfig()

    def skill_flags(self, seed: int, sample_index: int = 0) -> dict[str, bool]:
        """Which skills the expert shows in episode (seed, sample_index); deterministic."""
        rng = random.Random(f"store-expert:{self.config.seed}:{seed}:{sample_index}")
        return {c: rng.random() < self.config.skills[c] for c in CAPABILITIES}

    def plan(self, task: Task, skills: dict[str, bool]) -> list[Message]:
        """The expert's assistant messages for `task`, in order."""
        plan = _Plan(task)
        plan.call("find_user_id_by_email", email=task.scenario.email)
        _TYPE_PLANNERS[task.task_type](plan, skills)
        return plan.messages

    def policy_for(self, env: StoreEnv, skills: dict[str, bool]):
        """A policy function (messages, tools) -> assistant message for the env's current task.
        It answers by position: the n-th assistant turn gets the n-th planned message."""
        messages = self.plan(env.task, skills)

        def expert_policy(history: list[Message], tools: list[dict[str, Any]]) -> Message:
            n = sum(1 for m in history if m.role == "assistant")
            if n < len(messages):
                return messages[n]
            return Message.assistant("Is there anything else I can help you with?")

        return expert_policy

    def play(self, env: StoreEnv, seed: int, sample_index: int = 0,
             max_turns: int | None = None) -> Trajectory:
        """One expert episode as a Trajectory (the warm-start data format)."""
        skills = self.skill_flags(seed, sample_index)
        env.reset(seed)
        policy_fn = self.policy_for(env, skills)
        info = PolicyInfo(model="store-scripted-expert", version=self.config.digest())
        traj = run_episode(env, policy_fn, seed, max_turns, policy=info, sample_index=sample_index,
                           env_params={"task_types": ",".join(env.task_types)})
        traj.info["expert_skills"] = skills
        return traj
