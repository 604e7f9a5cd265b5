"""Scripted expert for the store domain, with planted, partial capability gaps.

The embedded default's base agents are warm-started by imitating this expert, so its gaps
become the base agent's gaps, which TRACE must then rediscover and repair. A gap is
*partial*: for each capability the config gives the probability that the expert shows the
skill in an episode (drawn per episode from a seeded generator, `skill_flags(seed,
sample_index)`), so the imitating policy varies between rollouts and GRPO groups carry
signal.

What the expert does without each skill (in compound tasks, per sub-request; in probe
tasks, only in the type that tests it):

| capability                 | without the skill                                                          |
|----------------------------|-----------------------------------------------------------------------------|
| structured_data_reasoning  | a request naming an item by its attributes: picks the first listed order holding the named product with an allowed status, ignoring the options -> a look-alike order (wrong_record) |
| multi_step_task_completion | handles only the first of several requests stated at once, then reports (subrequest_unaddressed); requests given one after another are all handled |
| precondition_verification  | writes without acting on the order's status: cancels without looking the order up, returns / exchanges after a lookup whatever the status says; a forbidding status is refused by the tool, too late (write_precondition_false) |
| tool_call_precision        | copies the user's loose order id / reason paraphrase into the call, gets an error and gives that request up (malformed_argument); the other requests go on |

With every skill at 1.0 the expert solves every task. The expert reads the task (its gold
facts) to plan, but every decision it makes is also determined by what the agent sees
(user messages and tool results): which order (the user's id, or the listing's line whose
item matches the attributes), whether to refuse (the status in the lookup), which
canonical id and reason (the user's words), so a policy imitating it can learn the same
behaviour.

Beside playing its own episodes, the expert says what it would do next in any state, another
policy's included (`StoreExpert.next_message`): the labels of imitation on the learner's own states
(`trace_common/agents/dagger.py`).

Semantics (compound tasks): skills are independent per episode, and a task passes iff
every capability it needs is shown (the tests pin this), so on a split
    pass rate = mean over tasks t of  prod_{c in t.capabilities} p_c
Probe types (one capability each): record_selection p_s; multi_request 0.2 + 0.8·p_m;
precondition_check 0.4 + 0.6·p_p; argument_format p_t (approximately: the mode and status
shares are per-seed draws).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trace_common.domains.store.env import StoreEnv
from trace_common.domains.store.task_model import (
    CAPABILITIES,
    MULTI,
    PRECISION,
    PRECONDITION,
    SDR,
    SubRequest,
    Task,
)
from trace_common.domains.store.tools import REQUIRED_STATUS
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
    """Builds the expert's assistant messages for one episode, each tagged with the sub-request
    it serves (`groups`: -1 for the opening user lookup, else the sub-request's index)."""

    def __init__(self, task: Task):
        self.task = task
        self.messages: list[Message] = []
        self.groups: list[int] = []
        self.group = -1

    def call(self, name: str, **arguments: Any) -> None:
        call_id = f"call_{len(self.messages)}"
        self.messages.append(Message.assistant(None, [ToolCall.create(call_id, name, arguments)]))
        self.groups.append(self.group)

    def say(self, text: str) -> None:
        self.messages.append(Message.assistant(text))
        self.groups.append(self.group)

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
    for plan.group, sr in enumerate(todo):
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


# -- compound tasks -------------------------------------------------------------------------------

_WRITE_TOOL = {"cancel": "cancel_pending_order", "return": "return_delivered_order_items",
               "exchange": "exchange_delivered_order_items"}
_DONE_VERB = {"cancel": "cancelled", "return": "returned", "exchange": "exchanged"}


def _exchange_sentence(plan: _Plan, order_id: str, item_id: str, new_item_id: str, product_id: str) -> str:
    order = plan.order(order_id)
    new = plan.task.db["products"][product_id]["variants"][new_item_id]
    old = next(r for r in order["items"] if r["item_id"] == item_id)
    diff = new["price"] - old["price"]
    direction = "charged to" if diff >= 0 else "refunded to"
    return (f"Exchange of the {item_label(old['name'], old['options'])} for ({', '.join(new['options'])}) in "
            f"order {order_id} is requested; price difference {money(abs(diff))} {direction} "
            f"{order['payment_method_id']}.")


def _refusal(order_id: str, status: str, base: str) -> str:
    need = REQUIRED_STATUS[_WRITE_TOOL[base]]
    return f"Order {order_id} is {status}, so it cannot be {_DONE_VERB[base]}; only {need} orders can be."


def _sorry(ref: str) -> str:
    return f"Sorry, I could not process your order {ref}."


def _compound_write(plan: _Plan, sr: SubRequest, order_id: str, item_id: str | None,
                    skills: dict[str, bool]) -> str:
    """The write of one cancel / return / exchange on `order_id` (canonical); its report sentence."""
    f, base = sr.facts, sr.base_kind
    order = plan.order(order_id)
    pm = order["payment_method_id"]
    if base == "cancel":
        reason = f["raw_reason"] if "raw_reason" in f and not skills[PRECISION] else f["reason"]
        plan.call("cancel_pending_order", order_id=order_id, reason=reason)
        if reason != f["reason"]:
            return _sorry(order_id)
    elif base == "return":
        plan.call("return_delivered_order_items", order_id=order_id, item_ids=[item_id], payment_method_id=pm)
    else:
        plan.call("get_product_details", product_id=f["product_id"])
        plan.call("exchange_delivered_order_items", order_id=order_id, item_ids=[item_id],
                  new_item_ids=[f["new_item_id"]], payment_method_id=pm)
    if order["status"] != REQUIRED_STATUS[_WRITE_TOOL[base]]:  # only without the precondition skill
        return _refusal(order_id, order["status"], base)
    if base == "exchange":
        assert item_id is not None
        return _exchange_sentence(plan, order_id, item_id, f["new_item_id"], f["product_id"])
    return _outcome_sentence(plan, sr, order_id, item_id)


def _compound_subrequest(plan: _Plan, sr: SubRequest, skills: dict[str, bool], listed: list[bool]) -> str:
    """Tool calls for one sub-request of a compound task; returns its report sentence."""
    task, f, base = plan.task, sr.facts, sr.base_kind
    if base == "address":
        plan.call("modify_user_address", user_id=task.user_id, address=f["address"])
        return _outcome_sentence(plan, sr, "")
    assert sr.order_id is not None
    if "by_attributes" in sr.traits:
        if not listed[0]:
            plan.call("list_user_orders", user_id=task.user_id)
            listed[0] = True
        order_id, item_id = ((sr.order_id, f["item_id"]) if skills[SDR]
                             else (f["decoy_order_id"], f["decoy_item_id"]))
        return _compound_write(plan, sr, order_id, item_id, skills)
    ref = f["raw_order_ref"] if "raw_order_ref" in f and not skills[PRECISION] else sr.order_id
    status = plan.order(sr.order_id)["status"]
    if base == "status":
        plan.call("get_order_details", order_id=ref)
        return _sorry(ref) if ref != sr.order_id else f"Order {sr.order_id} is {status}."
    if base == "cancel" and not skills[PRECONDITION]:
        if ref != sr.order_id:  # cancels with the copied id: a format error
            plan.call("cancel_pending_order", order_id=ref, reason=f.get("raw_reason", f["reason"]))
            return _sorry(ref)
        return _compound_write(plan, sr, sr.order_id, None, skills)
    plan.call("get_order_details", order_id=ref)
    if ref != sr.order_id:
        return _sorry(ref)
    if skills[PRECONDITION] and status != REQUIRED_STATUS[_WRITE_TOOL[base]]:
        return _refusal(sr.order_id, status, base)
    return _compound_write(plan, sr, sr.order_id, f.get("item_id"), skills)


def _compound(plan: _Plan, skills: dict[str, bool]) -> None:
    task = plan.task
    sequential = task.scenario.mode == "sequential"
    todo = task.subrequests if (skills[MULTI] or sequential) else task.subrequests[:1]
    listed = [False]
    sentences = []
    for plan.group, sr in enumerate(todo):
        sentence = _compound_subrequest(plan, sr, skills, listed)
        if sequential:
            plan.say(sentence)
        else:
            sentences.append(sentence)
    if not sequential:
        plan.say(" ".join(sentences))


_CLOSING = "Is there anything else I can help you with?"


def call_key(name: str, arguments: str) -> tuple[str, str]:
    """A call's identity: its name and its arguments, parsed (key order and spacing ignored);
    arguments that do not parse are kept verbatim (they never equal a planned call's)."""
    try:
        return name, json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return name, arguments


_TYPE_PLANNERS = {
    "compound": _compound,
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
        return self._plan(task, skills).messages

    def _plan(self, task: Task, skills: dict[str, bool]) -> _Plan:
        plan = _Plan(task)
        plan.call("find_user_id_by_email", email=task.scenario.email)
        plan.group = 0
        _TYPE_PLANNERS[task.task_type](plan, skills)
        return plan

    def next_message(self, task: Task, skills: dict[str, bool], history: Sequence[Message]) -> Message:
        """What the expert says next in ANY state of `task`, its own or another policy's (the
        label of imitation on the learner's states, DAgger); on its own states this is `plan()`'s
        next message.

        Semantics (plan = the messages of `plan(task, skills)`; a reply is a text message):
            segments = plan cut after each reply                    # one per request turn of the user
            j = user messages in history that are the scenario's follow-ups, in order
                                                                    # the user's answers to a question
                                                                    # (email, "yes") do not move j
            j >= len(segments):  the closing question
            a planned call is done when history holds at least as many identical calls
              (name, arguments) as the plan up to and including it  # over the whole history
            for each sub-request of segments[j], in order:         # -1, the user lookup, first
                f = its last done call
                if a call follows f within the sub-request: that call
            else: the segment's reply (the closing question if it has none)
        So a skipped read is not done after a later write of the same sub-request (the expert
        does not look an order up after cancelling it), a failed call is redone right, a
        sub-request of the current request turn another policy left undone is taken up before the
        reply (one of an earlier turn is not: the user has moved on), and the skill flags decide as
        in `plan()` (without multi-step, only the first of requests stated at once is handled).
        Calls match across turns, so a read another policy repeated in an earlier turn counts for
        an identical planned read of a later one.
        """
        plan = self._plan(task, skills)
        segments: list[list[int]] = [[]]
        for i, m in enumerate(plan.messages):
            segments[-1].append(i)
            if not m.tool_calls:
                segments.append([])
        if not segments[-1]:
            segments.pop()
        followups, j = task.scenario.followups, 0
        for m in history:
            if m.role == "user" and j < len(followups) and m.content == followups[j]:
                j += 1
        if j >= len(segments):
            return Message.assistant(_CLOSING)
        made = Counter(call_key(c.name, c.function.arguments)
                       for m in history if m.role == "assistant" for c in m.tool_calls or [])
        seen: Counter[tuple[str, str]] = Counter()
        done: dict[int, bool] = {}
        for i, m in enumerate(plan.messages):
            for c in m.tool_calls or []:
                key = call_key(c.name, c.function.arguments)
                seen[key] += 1
                done[i] = made[key] >= seen[key]
        calls = [i for i in segments[j] if plan.messages[i].tool_calls]
        for group in dict.fromkeys(plan.groups[i] for i in calls):
            mine = [i for i in calls if plan.groups[i] == group]
            last = max((k for k, i in enumerate(mine) if done[i]), default=-1)
            if last + 1 < len(mine):
                return plan.messages[mine[last + 1]]
        replies = [i for i in segments[j] if not plan.messages[i].tool_calls]
        return plan.messages[replies[0]] if replies else Message.assistant(_CLOSING)

    def policy_for(self, env: StoreEnv, skills: dict[str, bool]):
        """A policy function (messages, tools) -> assistant message for the env's current task.
        It answers by position: the n-th assistant turn gets the n-th planned message."""
        messages = self.plan(env.task, skills)

        def expert_policy(history: list[Message], tools: list[dict[str, Any]]) -> Message:
            n = sum(1 for m in history if m.role == "assistant")
            if n < len(messages):
                return messages[n]
            return Message.assistant(_CLOSING)

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
