"""Dev measurement for issue #31 item 4: does a record-selection drill learnt on its own carry to
the same choice inside a conversation?

After fine-tunes with `retrieval_drills` (a by-attributes request and the order listing, answered
by the right order and item ids) held-out drill exactness rose from 0 to 0.215 and 0.425, yet the
agent's greedy record selection stayed at 0.45. This scores each given model, teacher-forced
(greedy = all-argmax), on two held-out sets of the same choice, fixed before the run:
- `drills`: `micro_dagger.retrieval_drills`' 200 held-out drills (train seeds from 20,000);
- `in_conversation`: `micro_dagger.context_drills`' held-out ones (train seeds from 40,000): the
  skilled teacher's conversation up to its call naming the designated order, scored on that call;
- each again scored on the order id's tokens alone (`*_order_id`: the choice of record, apart from
  the item id and, in the conversation, the rest of the call).
And in the agent (`--agent-episodes`, default 100): each model plays the first dev tasks greedy and
unguided (the build probe's condition), and `agent_choices` counts, for each by-attributes
sub-request, where the writes of its tool went: the designated order, the look-alike decoy, or
elsewhere (split by what that order is), or nowhere -- the choice the drills teach, apart from
whether the request was reached at all (the probe's record-selection rate counts a request never
written as met: attribution blames it on multi-step completion). `--no-teacher-forced` plays only.
Nothing is trained; the test split is never played.

    python scripts/experiments/micro_drill_transfer.py --model shipped=trace_common/agents/shipped/micro \\
        --model control=<dir> ... --json docs/micro-drill-transfer-<date>.json
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

from micro_dagger import context_drills, play_model, retrieval_drills
from record_code import REPO, code_state


def score(model_dir: Path, sets: dict[str, list[Any]]) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from trace_common.agents.sft import teacher_forced_accuracy

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = Qwen3ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        return {name: {k: round(v, 4) for k, v in teacher_forced_accuracy(model, examples,
                                                                          tokenizer.pad_token_id).items()}
                for name, examples in sets.items()}


def teacher_episodes(episodes: int) -> list[Any]:
    """The warm start's teacher (its skill draws) on the first `episodes` dev tasks, 4 draws each."""
    from trace_common.agents.guided_probe import split_seeds
    from trace_common.agents.micro import MicroConfig
    from trace_common.domains.store import ExpertConfig, StoreEnv, StoreExpert

    data = MicroConfig().data
    expert = StoreExpert(ExpertConfig(skills=data.skills, seed=data.expert_seed))
    env = StoreEnv()
    return [expert.play(env, seed, sample) for seed in split_seeds("dev", episodes) for sample in range(4)]


CHOICES = ("designated", "decoy", "both", "elsewhere_other_request", "elsewhere_status_twin",
           "elsewhere_users_order", "elsewhere_garbled", "elsewhere_made_up", "unparsable_only",
           "nowhere_listed", "nowhere_unlisted")


def _digits(order_id: str) -> str:
    return re.sub(r"\D", "", order_id)


def agent_choices(trajectories: Sequence[Any]) -> dict[str, int]:
    """Counts over the by-attributes sub-requests of `trajectories`, by where the writes of the
    request's own tool went (a compound task's requests are of distinct kinds, so no other request
    uses that tool):

        designated / decoy / both   a write on the designated order, the look-alike decoy, or both
        elsewhere_*                 else, by the first write's order: one another request names
                                    (other_request); one of the user's holding the same item, whose
                                    status forbids the request (status_twin: the generator plants
                                    one for half of these requests); another of the user's orders
                                    (users_order); an id that is none of the user's but has the
                                    designated or the decoy order's digits (garbled: a slip in
                                    copying); any other id (made_up)
        unparsable_only             only writes whose arguments do not parse
        nowhere_listed / _unlisted  no write of the tool; the episode did / did not list the user's
                                    orders (anywhere in it)"""
    from trace_common.domains.store import StoreEnv
    from trace_common.domains.store.attribution import WRITE_TOOL

    counts = dict.fromkeys(CHOICES, 0)
    env = StoreEnv()
    for traj in trajectories:
        env.reset(traj.seed)
        orders: dict[str, list[str]] = {}
        unparsable: set[str] = set()
        listed = False
        for m in traj.messages:
            for call in (m.tool_calls or []) if m.role == "assistant" else []:
                name, args = call.function.name, call.function.arguments
                listed = listed or name == "list_user_orders"
                try:
                    args = json.loads(args) if isinstance(args, str) else args
                except ValueError:
                    unparsable.add(name)
                    continue
                if isinstance(args, dict) and isinstance(args.get("order_id"), str):
                    orders.setdefault(name, []).append(args["order_id"])
                else:
                    unparsable.add(name)
        task = env.task
        users = {o: row for o, row in task.db["orders"].items() if row.get("user_id") == task.user_id}
        for sr in task.subrequests:
            if "by_attributes" not in sr.traits:
                continue
            tool = WRITE_TOOL[sr.base_kind]
            written = orders.get(tool, [])
            right, decoy = sr.order_id in written, sr.facts["decoy_order_id"] in written
            if right or decoy:
                counts["both" if right and decoy else "designated" if right else "decoy"] += 1
            elif written:
                first = written[0]
                item = sr.facts["item_id"]
                counts["elsewhere_other_request" if any(o.order_id == first for o in task.subrequests)
                       else "elsewhere_status_twin" if first in users and any(
                           r.get("item_id") == item for r in users[first]["items"])
                       else "elsewhere_users_order" if first in users
                       else "elsewhere_garbled" if _digits(first) in {_digits(sr.order_id),
                                                                      _digits(sr.facts["decoy_order_id"])}
                       else "elsewhere_made_up"] += 1
            elif tool in unparsable:
                counts["unparsable_only"] += 1
            else:
                counts["nowhere_listed" if listed else "nowhere_unlisted"] += 1
    return counts


def _shown(path: Path) -> str:
    """A model directory as a record may show it: relative to the repository, or only its name
    (a machine's own paths stay out of committed records)."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else f"(outside the repository) {path.name}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, metavar="LABEL=DIR",
                    help="a model to score (repeat); every model must share the first one's tokenizer")
    ap.add_argument("--agent-episodes", type=int, default=100, help="dev tasks each model plays (0: none)")
    ap.add_argument("--no-teacher-forced", action="store_true", help="skip the held-out drill scores")
    ap.add_argument("--json", type=Path, help="write the record here")
    args = ap.parse_args(argv)
    models = []
    for item in args.model:
        label, sep, path = item.partition("=")
        if not sep or not label or not Path(path, "config.json").is_file():
            ap.error(f"--model {item!r}: expected LABEL=DIR, DIR a saved model (with config.json)")
        models.append((label, Path(path)))
    from transformers import AutoTokenizer

    from trace_common.agents.guided_probe import split_seeds

    tokenizer = AutoTokenizer.from_pretrained(models[0][1])
    sets: dict[str, list[Any]] = {} if args.no_teacher_forced else {
        "drills": retrieval_drills(tokenizer, 0)[1], "in_conversation": context_drills(tokenizer, 0)[1],
        "drills_order_id": retrieval_drills(tokenizer, 0, "order_id")[1],
        "in_conversation_order_id": context_drills(tokenizer, 0, "order_id")[1]}
    rows = {}
    for label, path in models:
        if AutoTokenizer.from_pretrained(path).get_vocab() != tokenizer.get_vocab():
            raise SystemExit(f"--model {label}: another tokenizer than {models[0][0]}'s; score it in its own run")
        t0 = time.perf_counter()
        rows[label] = score(path, sets)
        if args.agent_episodes:
            played = asyncio.run(play_model(path, split_seeds("dev", args.agent_episodes), 0.0, 0))
            rows[label]["agent_choices"] = agent_choices(played)
            rows[label]["agent_passed"] = sum(t.success for t in played)
        rows[label]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"[{time.strftime('%H:%M:%S')}] {label}: " + ", ".join(
            f"{k} exact {v['turn_exact']:.3f}" for k, v in rows[label].items() if isinstance(v, dict)
            and "turn_exact" in v) + f"; in the agent {rows[label].get('agent_choices')}", flush=True)
    if args.agent_episodes:
        rows["teacher (4 draws per task)"] = {"agent_choices": agent_choices(teacher_episodes(args.agent_episodes))}
        print(f"teacher: {rows['teacher (4 draws per task)']}", flush=True)
    record = {**code_state(), "held_out": {k: len(v) for k, v in sets.items()}, "agent_episodes": args.agent_episodes,
              "models": {label: _shown(path) for label, path in models}, "scores": rows}
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
