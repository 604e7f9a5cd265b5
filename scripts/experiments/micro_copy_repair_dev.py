"""Dev diagnostic for issue #31 item 4: how much of `micro`'s distance from its teacher is copying?

Where a `micro` episode first departs from its teacher, it is most often a tool call with a wrong id
argument, and about half of those ids occur nowhere in the conversation (the model made them up;
`micro_dagger.py`'s roll-in, 800 train episodes). This asks how the model would do if each made-up id
were mended to the nearest real one: the same episodes (first 100 dev tasks, unguided, T = 1, seeds
0-3, 400 in all) played twice, plainly and with each made-up id mended before the tool runs.

Mending (a diagnostic, never part of an agent): an id argument (`ID_PATTERNS`) whose value occurs
nowhere earlier in the conversation as a whole (the system prompt and tool error messages aside) is
replaced by the id of the same kind that does occur there and is closest to it in edit distance (the
first such on ties); a value that occurs (a loose id the user wrote, a look-alike order the model
chose) is left alone, and so is everything but ids. So the agent still chooses its records and tools
itself; only ids it could not have read are mended, to the nearest one it could.

If the mended agent passes about as often as the teacher (81 of 400), copying slips are what keep
`micro` from its teacher; if it stays far below, the rest is choice (records, tools, replies) or ids
made up far from the right one, which `--learner` (a roll-in's first wrong ids, counted per id, not
per episode: whether each stands in the conversation or is made up, and how far a made-up one is
from the wanted id) tells apart. The test split is never played. The record's run (2026-12-06; 2,632 s of play at low
priority beside the test suite on 2 cores, about 8 minutes alone; two earlier runs gave the same pass
counts): plainly 11 of 400 pass,
mended 8 (277 ids mended); the roll-in's first departures with a wrong id hold 205 ids that stand in
the conversation and 223 made-up ones, 151 of those 4-5 edits from the wanted id.

    python scripts/experiments/micro_copy_repair_dev.py --model shipped=trace_common/agents/shipped/micro \
        --json docs/micro-copy-repair-dev-<date>.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from record_code import code_state

REPO = Path(__file__).resolve().parents[2]
TASKS = 100
SAMPLES = 4
#: Tool argument -> the form of the ids it takes (the store's tools: `trace_common/domains/store/tools.py`).
ID_PATTERNS: dict[str, str] = {
    "order_id": r"#W\d{5}",
    "item_ids": r"\b\d{5}\b",
    "new_item_ids": r"\b\d{5}\b",
    "product_id": r"\b\d{4}\b",
    "payment_method_id": r"\b(?:gift_card|credit_card|paypal)_\d+\b",
    "user_id": r"\b[a-z]+_[a-z]+_\d{4}\b",
}


def edit_distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _context(history: Sequence[Any]) -> str:
    """What the agent has read and written so far, less the system prompt and the tools' error messages
    (their example ids, '#W12345' and the like, are no record's)."""
    parts = []
    for m in history:
        if m.role != "system" and not (m.role == "tool" and (m.content or "").startswith("Error:")):
            parts.append(m.content or "")
        parts += [c.function.arguments for c in m.tool_calls or []]
    return "\n".join(parts)


def stands_in(value: str, context: str) -> bool:
    """`value` stands in `context` as a whole (not inside a longer id: "53350" does not occur in "#W53350")."""
    return re.search(r"(?<![\w#])" + re.escape(value) + r"(?!\w)", context) is not None


def repair_value(value: Any, pattern: str, context: str) -> tuple[Any, bool]:
    """(the value, or the nearest in-context id of `pattern` when `value` occurs nowhere in `context`;
    whether it was replaced)."""
    if not isinstance(value, str) or not value or stands_in(value, context):
        return value, False
    candidates = list(dict.fromkeys(re.findall(pattern, context)))
    if not candidates:
        return value, False
    best = min(candidates, key=lambda c: edit_distance(value, c))
    return best, best != value


def repair_message(message: Any, history: Sequence[Any]) -> tuple[Any, int]:
    """`message` with made-up ids in its tool calls repaired (module docstring); how many."""
    from trace_common.env.messages import ToolCall

    if not message.tool_calls:
        return message, 0
    context = _context(history)
    calls, repaired = [], 0
    for call in message.tool_calls:
        try:
            args = json.loads(call.function.arguments)
        except ValueError:
            calls.append(call)
            continue
        if not isinstance(args, dict):
            calls.append(call)
            continue
        for key, pattern in ID_PATTERNS.items():
            if key not in args:
                continue
            if isinstance(args[key], list):
                fixed = [repair_value(v, pattern, context) for v in args[key]]
                args[key] = [v for v, _ in fixed]
                repaired += sum(r for _, r in fixed)
            else:
                args[key], r = repair_value(args[key], pattern, context)
                repaired += r
        calls.append(ToolCall.create(call.id, call.name, args))
    return message.model_copy(update={"tool_calls": calls}), repaired


class _Repairing:
    """A `Policy` for `play_episodes` whose replies have made-up ids repaired; counts repairs."""

    def __init__(self, inner: Any):
        self.inner, self.name, self.adapter = inner, inner.name, inner.adapter
        self.repairs = 0

    def policy_fn(self, loop: Any, params: Any, **kwargs: Any):
        fn = self.inner.policy_fn(loop, params, **kwargs)

        def call(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
            turn = fn(messages, tools)
            fixed, n = repair_message(turn.message, messages)
            self.repairs += n
            turn.message = fixed
            return turn

        return call


async def play(model_dir: Path, repair: bool) -> dict[str, Any]:
    from trace_common.agents.guided_probe import split_seeds
    from trace_common.domains.store import StoreEnv
    from trace_common.policy.base import SamplingParams
    from trace_common.policy.episodes import play_episodes
    from trace_common.policy.transformers_backend import TransformersPolicy

    inner = TransformersPolicy.from_dir(model_dir, max_batch=32)
    policy = _Repairing(inner) if repair else inner
    trajs = []
    try:
        for seed in range(SAMPLES):
            trajs += await play_episodes(StoreEnv, policy, [(s, 0) for s in split_seeds("dev", TASKS)],
                                         SamplingParams(temperature=1.0, seed=seed, max_tokens=256))
    finally:
        await inner.close()
    return {"passed": sum(t.success for t in trajs), "episodes": len(trajs),
            "repaired_ids": policy.repairs if repair else 0,
            "assistant_turns": sum(1 for t in trajs for m in t.messages if m.role == "assistant")}


def first_wrong_ids(learner_jsonl: Path) -> dict[str, Any]:
    """On a roll-in (`micro_dagger.py`'s learner.jsonl): at each episode's first departure from its
    teacher that is the right tool with a wrong id, for each wrong id (list elements one by one, against
    the wanted list's in order): whether it stands whole in the conversation (another record's id, or
    any number of that shape: a zip code can stand for an item id) or is made up, whether mending it
    (`repair_value`) would give the wanted id, and how far (edit distance) each made-up id is from the
    wanted one: a near miss is a copying slip, a far one an id the model did not find."""
    import collections

    from trace_common.agents.dagger import explaining_flags
    from trace_common.agents.micro import MicroConfig
    from trace_common.domains.store import ExpertConfig, StoreEnv, StoreExpert
    from trace_common.env.trajectory import loads_jsonl

    data = MicroConfig().data
    expert = StoreExpert(ExpertConfig(skills=data.skills, seed=data.expert_seed))
    env = StoreEnv(task_types=data.task_types)
    kinds: collections.Counter[str] = collections.Counter()
    distance: collections.Counter[int] = collections.Counter()
    learner = loads_jsonl(learner_jsonl.read_bytes(), source=str(learner_jsonl))
    departures = 0
    for t in learner:
        env.reset(t.seed)
        flags, d = explaining_flags(expert, env.task, expert.skill_flags(t.seed, t.sample_index), t.messages)
        if d is None:
            continue
        i = [j for j, m in enumerate(t.messages) if m.role == "assistant"][d]
        label, got = expert.next_message(env.task, flags, t.messages[:i]), t.messages[i]
        if not (label.tool_calls and got.tool_calls and label.tool_calls[0].name == got.tool_calls[0].name):
            continue
        try:
            have = json.loads(got.tool_calls[0].function.arguments)
        except ValueError:
            continue
        want, context = json.loads(label.tool_calls[0].function.arguments), _context(t.messages[:i])
        departures += isinstance(have, dict) and any(k in want and have.get(k) != want[k] for k in ID_PATTERNS)
        for key, pattern in ID_PATTERNS.items():
            if key not in want or not isinstance(have, dict) or have.get(key) == want[key]:
                continue
            wanted_ids = want[key] if isinstance(want[key], list) else [want[key]]
            given = have.get(key)
            given_ids = given if isinstance(given, list) else [given]
            for w, v in zip(wanted_ids, given_ids + [None] * (len(wanted_ids) - len(given_ids)), strict=False):
                if v == w:
                    continue
                if not isinstance(v, str):
                    kinds["missing_or_not_text"] += 1
                elif stands_in(v, context):
                    kinds["stands_in_conversation"] += 1
                else:
                    mended, replaced = repair_value(v, pattern, context)
                    kinds["made_up:" + ("nothing_to_mend_to" if not replaced else
                                        "mends_to_wanted" if mended == w else "mends_to_another")] += 1
                    distance[edit_distance(v, w)] += 1
    seeds = [t.seed for t in learner]
    return {"roll_in": {"file": learner_jsonl.name, "episodes": len(learner), "seeds": [min(seeds), max(seeds)]},
            "departures_with_a_wrong_id": departures, "wrong_ids": dict(sorted(kinds.items())),
            "made_up_edit_distance_to_wanted": dict(sorted(distance.items()))}


def teacher() -> dict[str, Any]:
    from trace_common.agents.guided_probe import teacher_trajectories
    from trace_common.agents.micro import MicroConfig

    trajs = teacher_trajectories(MicroConfig().data, "dev", TASKS, SAMPLES)
    return {"passed": sum(t.success for t in trajs), "episodes": len(trajs)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", metavar="NAME=DIR")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--learner", type=Path, help="a roll-in (micro_dagger.py's learner.jsonl) to analyse too")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"split": "dev", "tasks": TASKS, "samples_per_task": SAMPLES, "temperature": 1.0,
                           **code_state(), "teacher": teacher()}
    if args.learner:
        out["roll_in_first_wrong_ids"] = first_wrong_ids(args.learner)
        print(json.dumps(out["roll_in_first_wrong_ids"]), flush=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")  # kept even when no --model follows
    started = time.perf_counter()
    for spec in args.model or []:
        name, _, path = spec.partition("=")
        model_dir = Path(path)
        shown = str(model_dir.resolve().relative_to(REPO)) if model_dir.resolve().is_relative_to(REPO) else name
        out[name] = {"model": shown, **{cond: asyncio.run(play(model_dir, cond == "repaired"))
                                        for cond in ("plain", "repaired")}}
        print(name, json.dumps(out[name]), flush=True)
        out["seconds"] = round(time.perf_counter() - started, 1)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
