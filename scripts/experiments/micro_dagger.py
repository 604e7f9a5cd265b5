"""Dev experiment for issue #31 item 4: does imitation on the agent's own states (DAgger,
`trace_common.agents.dagger`) bring `micro` close to its teacher?

One DAgger round on top of a built model (the shipped `micro` by default):
1. roll-in: the model plays `--episodes` train tasks (seeds from 3,000: past the warm start's
   2,000 and its 32 held-out ones), sampled at T = 1, unguided;
2. label: a recovery episode per episode that departs from its teacher (`dagger.recovery_episodes`),
   and where and how the roll-in departs (`departure_shape`);
3. train: `--steps` steps from the model's weights on the warm start's own 2,000 teacher episodes
   plus the recovery episodes (loss on the teacher's turns only), `--lr` peak, cosine to a tenth;
   `--recovery 0` trains on the teacher episodes alone: the control that tells DAgger's labels
   from more steps of the same imitation; `--drills N` adds N record-selection drills
   (`retrieval_drills`: a by-attributes request and the order listing, answered by the right ids);
   `--context-drills N` adds N of the same choices asked inside the skilled teacher's conversations
   (`context_drills`: the conversation up to the call that names the designated order, loss on it);
4. measure on the first 100 dev tasks: the build's guidance probe (teacher; model greedy, unguided
   and guided) and its verdict against the criterion fixed before the build
   (`guided_probe.close_to_teacher`), and passes of 400 unguided at T = 1 (4 seeds).
The test split is never played. Each stage writes its result under `--out` and is skipped when
rerun with the same `--out` (a resumed run repeats nothing done).

    python scripts/experiments/micro_dagger.py --out dagger-run --json docs/micro-dagger-<date>.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from record_code import code_state

REPO = Path(__file__).resolve().parents[2]
FIRST_SEED = 3000
DEV_TASKS = 100


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


async def play_model(model_dir: Path, seeds: Sequence[int], temperature: float, seed: int) -> list[Any]:
    """`model_dir` plays the store tasks `seeds`, unguided (shared with micro_drill_transfer)."""
    from trace_common.domains.store import StoreEnv
    from trace_common.policy.base import SamplingParams
    from trace_common.policy.episodes import play_episodes
    from trace_common.policy.transformers_backend import TransformersPolicy

    policy = TransformersPolicy.from_dir(model_dir, max_batch=32)
    try:
        return await play_episodes(StoreEnv, policy, [(s, 0) for s in seeds],
                                   SamplingParams(temperature=temperature, seed=seed, max_tokens=256))
    finally:
        await policy.close()


def roll_in(model_dir: Path, out: Path, episodes: int) -> list[Any]:
    from trace_common.env.trajectory import dumps_jsonl, loads_jsonl

    path = out / "learner.jsonl"
    if path.is_file():
        return loads_jsonl(path.read_bytes(), source=str(path))
    _log(f"roll-in: {model_dir} plays {episodes} train tasks at T=1")
    t0 = time.perf_counter()
    trajs = asyncio.run(play_model(model_dir, range(FIRST_SEED, FIRST_SEED + episodes), 1.0, 0))
    _log(f"roll-in done in {time.perf_counter() - t0:.0f} s: {sum(t.success for t in trajs)} of {len(trajs)} pass")
    (out / "learner.meta.json").write_text(json.dumps({"seconds": round(time.perf_counter() - t0, 1)}))
    path.with_suffix(".tmp").write_bytes(dumps_jsonl(trajs))
    path.with_suffix(".tmp").replace(path)
    return trajs


def label(learner: Sequence[Any], out: Path) -> list[Any]:
    from trace_common.agents.dagger import recovery_episodes
    from trace_common.agents.micro import MicroConfig
    from trace_common.domains.store import ExpertConfig, StoreExpert
    from trace_common.env.trajectory import dumps_jsonl, loads_jsonl

    path = out / "recovery.jsonl"
    if path.is_file():
        return loads_jsonl(path.read_bytes(), source=str(path))
    data = MicroConfig().data
    expert = StoreExpert(ExpertConfig(skills=data.skills, seed=data.expert_seed))
    t0 = time.perf_counter()
    rec = recovery_episodes(expert, learner, task_types=data.task_types)
    _log(f"labelled {len(rec)} recovery episodes of {len(learner)} in {time.perf_counter() - t0:.0f} s")
    path.with_suffix(".tmp").write_bytes(dumps_jsonl(rec))
    path.with_suffix(".tmp").replace(path)
    return rec


def departure_shape(learner: Sequence[Any], out: Path) -> dict[str, Any]:
    """Where the roll-in departs from its teacher (the explaining draw's labels, `dagger.explaining_flags`):
    - the per-turn hazard of a first departure, and how often the learner's later turns differ from the label;
    - what the first departure is (counts "first:<kind>"): `wrong_tool`, `reply_for_call` (a reply where a
      call was due), `call_for_reply`, `reply_text` (another reply), `unparsable_arguments`,
      `argument_missing` (a wanted argument left out), `other_call_difference` (the first call right, the
      message's other calls not), or a wrong argument value, `argument_found_in_conversation` when every
      wrong value stands whole in the conversation (not inside a longer id; the system prompt aside),
      else `argument_found_nowhere`;
    - whether the skilled expert taking over just before / just after it still solves the task;
    - of the episodes that never depart: how many fail, and how many of them the chosen draw explains
      without each skill (`no_departure_without:<skill>`), split for multi-step into requests stated at
      once and sequential ones (where the expert handles every request whatever its flag)."""
    import collections

    # The copy-mending script's rule for a value standing whole in the conversation (this directory is
    # on sys.path when a script here runs), so both records count "found" alike.
    from micro_copy_repair_dev import stands_in

    from trace_common.agents.dagger import explaining_flags, same_message
    from trace_common.agents.micro import MicroConfig
    from trace_common.domains.store import ExpertConfig, StoreEnv, StoreExpert
    from trace_common.env.episode import run_episode

    path = out / "departures.json"
    if path.is_file():
        return json.loads(path.read_text())
    data = MicroConfig().data
    expert = StoreExpert(ExpertConfig(skills=data.skills, seed=data.expert_seed))
    perfect = StoreExpert(ExpertConfig.perfect())
    env = StoreEnv(task_types=data.task_types)
    c: collections.Counter[str] = collections.Counter()
    for t in learner:
        env.reset(t.seed)
        task = env.task
        flags, d = explaining_flags(expert, task, expert.skill_flags(t.seed, t.sample_index), t.messages)
        turns = [i for i, m in enumerate(t.messages) if m.role == "assistant"]
        if d is None:
            c["no_departure"] += 1
            c["no_departure_failed"] += not t.success
            for cap, shown in flags.items():
                c[f"no_departure_without:{cap}"] += not shown
            if not flags["multi_step_task_completion"]:
                c[f"no_departure_without_multi_step:{task.scenario.mode}"] += 1
                c[f"no_departure_without_multi_step:{task.scenario.mode}:passed"] += t.success
            c["turns_before_departure"] += len(turns)
            continue
        c["turns_before_departure"] += d
        for n, i in enumerate(turns[d:], start=d):
            label, got = expert.next_message(task, flags, t.messages[:i]), t.messages[i]
            if n > d:
                c["turns_after"] += 1
                c["turns_after_off_label"] += not same_message(got, label)
                continue
            want = label.tool_calls[0].name if label.tool_calls else None
            have = got.tool_calls[0].name if got.tool_calls else None
            if want != have:
                c["first:" + ("reply_for_call" if have is None else "call_for_reply" if want is None
                              else "wrong_tool")] += 1
            elif want is None:
                c["first:reply_text"] += 1
            else:
                try:
                    args = json.loads(got.tool_calls[0].function.arguments)
                except ValueError:
                    c["first:unparsable_arguments"] += 1
                    continue
                wanted = json.loads(label.tool_calls[0].function.arguments)
                bad = [args.get(k) for k, v in wanted.items() if args.get(k) != v] if isinstance(args, dict) else []
                if not bad:
                    c["first:other_call_difference"] += 1
                    continue
                if any(v is None for v in bad):
                    c["first:argument_missing"] += 1
                    continue
                seen = "\n".join((m.content or "") + " ".join(x.function.arguments for x in m.tool_calls or [])
                                  for m in t.messages[:i] if m.role != "system")
                values = [str(x) for v in bad for x in (v if isinstance(v, list) else [v])]
                found = all(stands_in(x, seen) for x in values)
                c["first:argument_" + ("found_in_conversation" if found else "found_nowhere")] += 1
        replay = [t.messages[i] for i in turns]
        skilled = dict.fromkeys(flags, True)
        for name, k in (("before", d), ("after", d + 1)):
            def policy(history, tools, k=k, replay=replay, task=task, skilled=skilled):
                n = sum(1 for m in history if m.role == "assistant")
                return replay[n] if n < k else perfect.next_message(task, skilled, history)
            c[f"skilled_takeover_{name}_passes"] += run_episode(env, policy, t.seed).success
    departed = len(learner) - c["no_departure"]
    result = {"episodes": len(learner), "departed": departed, "counts": dict(sorted(c.items())),
              "first_departure_hazard_per_turn": round(departed / max(1, c["turns_before_departure"] + departed), 4),
              "off_label_after_departure": round(c["turns_after_off_label"] / max(1, c["turns_after"]), 4)}
    _log(f"departures: {json.dumps(result)}")
    path.write_text(json.dumps(result, indent=1))
    return result


DRILL_FIRST_SEED = 20_000
DRILLS_HELD_OUT = 200


def retrieval_drills(tokenizer: Any, count: int, target: str = "answer") -> tuple[list[Any], list[Any]]:
    """`count` record-selection drills to train on and `DRILLS_HELD_OUT` held-out ones: each a
    by-attributes request of a compound train task (seeds from `DRILL_FIRST_SEED`, past the roll-in's)
    and the user's order listing, in the chat format, answered by the right order id and item id (the
    skilled teacher's choice; the look-alike order and the same item in a forbidding status sit in the
    same listing). Loss on the answer only (`target="order_id"`: on the tokens that spell the order
    id, to score that choice alone). Held out are the first tasks' drills, whole tasks
    (at least `DRILLS_HELD_OUT` drills), so no held-out listing is trained on."""
    if target not in ("answer", "order_id"):
        raise ValueError(f"target: expected 'answer' or 'order_id', got {target!r}")
    from trace_common.agents.sft import SFTExample
    from trace_common.domains.store import generate_task
    from trace_common.domains.store.tools import call_tool

    drills: list[Any] = []
    held_out: list[Any] = []
    seed = DRILL_FIRST_SEED
    while len(held_out) < DRILLS_HELD_OUT or len(drills) < count:
        task = generate_task(seed)
        seed += 1
        of_task = []
        for sr in task.subrequests:
            if "by_attributes" not in sr.traits:
                continue
            listing = call_tool(task.db, "list_user_orders", {"user_id": task.user_id}).text
            prompt = (f"<|im_start|>user\n{sr.text}<|im_end|>\n<|im_start|>tool\n{listing}<|im_end|>\n"
                      "<|im_start|>assistant\n")
            answer = f"{sr.order_id} {sr.facts['item_id']}<|im_end|>"
            p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            enc = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
            a_ids = enc["input_ids"]
            a_mask = ([True] * len(a_ids) if target == "answer"
                      else [s < len(sr.order_id) and e > s for s, e in enc["offset_mapping"]])
            of_task.append(SFTExample(p_ids + a_ids, [False] * len(p_ids) + a_mask, group=2))
        (held_out if len(held_out) < DRILLS_HELD_OUT else drills).extend(of_task)  # whole tasks on one side
    return drills[:count], held_out


CONTEXT_DRILL_FIRST_SEED = 40_000


def _named_order(message: Any) -> set[str]:
    """The order ids an assistant message's tool calls name (argument `order_id`)."""
    out = set()
    for call in message.tool_calls or []:
        args = call.function.arguments
        args = json.loads(args) if isinstance(args, str) else args
        if isinstance(args, dict) and isinstance(args.get("order_id"), str):
            out.add(args["order_id"])
    return out


def context_drills(tokenizer: Any, count: int, target: str = "call") -> tuple[list[Any], list[Any]]:
    """Record selection inside the conversation: `count` drills to train on and `DRILLS_HELD_OUT`
    held-out ones. The skilled teacher (every skill at 1) plays compound train tasks (seeds from
    `CONTEXT_DRILL_FIRST_SEED`, past `retrieval_drills`' and the warm start's); for each by-attributes
    sub-request, a drill is the conversation up to the teacher's first call naming the designated
    order (the write, which carries the order and item ids), with the loss on that call only
    (`target="order_id"`: on the tokens that spell the order id in it, to score that choice alone) -- the
    same choice as a `retrieval_drills` drill, asked where the agent meets it: after the system
    prompt, a user message holding several requests and the turns before it. A sub-request whose
    order an earlier user message or call already named is skipped (nothing to find). Held out are
    the first tasks' drills, whole tasks."""
    if target not in ("call", "order_id"):
        raise ValueError(f"target: expected 'call' or 'order_id', got {target!r}")
    from trace_common.agents.sft import SFTExample
    from trace_common.domains.store import CAPABILITIES, ExpertConfig, StoreEnv, StoreExpert
    from trace_common.policy.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    expert = StoreExpert(ExpertConfig(skills=dict.fromkeys(CAPABILITIES, 1.0)))
    env = StoreEnv()
    drills: list[Any] = []
    held_out: list[Any] = []
    seed = CONTEXT_DRILL_FIRST_SEED
    while len(held_out) < DRILLS_HELD_OUT or len(drills) < count:
        traj = expert.play(env, seed)
        task = env.task
        seed += 1
        text, spans = chat.assistant_spans(traj.messages, traj.tools)
        turns = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
        of_task = []
        for sr in task.subrequests:
            if "by_attributes" not in sr.traits or sr.order_id is None:
                continue
            at = next((n for n, i in enumerate(turns) if sr.order_id in _named_order(traj.messages[i])), None)
            if at is None:
                continue
            before = traj.messages[:turns[at]]
            if any(m.role == "user" and sr.order_id in (m.content or "") for m in before) or any(
                    m.role == "assistant" and sr.order_id in _named_order(m) for m in before):
                continue
            start, end = spans[at]
            if target == "order_id":
                key = f'"order_id": "{sr.order_id}"'
                start = text.index(key, start, end) + len(key) - len(sr.order_id) - 1
                lo, hi = start, start + len(sr.order_id)
            enc = tokenizer(text[:end], add_special_tokens=False, return_offsets_mapping=True)
            mask = ([e > s and start <= s and e <= end for s, e in enc["offset_mapping"]] if target == "call"
                    else [e > s and s < hi and e > lo for s, e in enc["offset_mapping"]])
            of_task.append(SFTExample(list(enc["input_ids"]), mask, group=3))
        (held_out if len(held_out) < DRILLS_HELD_OUT else drills).extend(of_task)  # whole tasks on one side
    return drills[:count], held_out


def train(model_dir: Path, recovery: Sequence[Any], out: Path, steps: int, lr: float, drills: int = 0,
          in_context: int = 0) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from trace_common.agents.dagger import recovery_examples
    from trace_common.agents.data import expert_trajectories
    from trace_common.agents.micro import MicroConfig
    from trace_common.agents.sft import SFTConfig, build_examples, teacher_forced_accuracy
    from trace_common.agents.sft import train as sft_train

    target = out / "model"
    meta = out / "train.json"
    if meta.is_file() and target.is_dir():
        done = json.loads(meta.read_text())
        asked = {"steps": steps, "learning_rate": lr, "recovery_examples": len(recovery), "drills": drills,
                 "context_drills": in_context}
        got = {"steps": done["steps"], "learning_rate": done["learning_rate"],
               "recovery_examples": done.get("recovery_episodes", len(recovery)), "drills": done.get("drills", 0),
               "context_drills": done.get("context_drills", 0)}
        if asked != got:
            raise SystemExit(f"{out} holds a model trained with {got}, not {asked}: give another --out")
        return done
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = Qwen3ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    teacher = build_examples(tokenizer, expert_trajectories(MicroConfig().data))
    extra = recovery_examples(tokenizer, recovery)
    drill_train, drill_held_out = retrieval_drills(tokenizer, drills)
    context_train, context_held_out = context_drills(tokenizer, in_context)
    before = teacher_forced_accuracy(model, drill_held_out, tokenizer.pad_token_id)["turn_exact"]
    context_before = teacher_forced_accuracy(model, context_held_out, tokenizer.pad_token_id)["turn_exact"]
    cfg = SFTConfig(steps=steps, batch_size=8, learning_rate=lr, copy_steps=0, max_seq_len=3072)
    _log(f"training {steps} steps at lr {lr:g} on {len(teacher)} teacher + {len(extra)} recovery examples"
         f" + {len(drill_train)} record-selection drills + {len(context_train)} in the conversation"
         f" (held-out exact before: drills {before:.3f}, in the conversation {context_before:.3f})")
    result = sft_train(model, teacher + extra + drill_train + context_train, cfg, tokenizer.pad_token_id,
                       log=_log, log_every=25)
    after = teacher_forced_accuracy(model, drill_held_out, tokenizer.pad_token_id)["turn_exact"]
    context_after = teacher_forced_accuracy(model, context_held_out, tokenizer.pad_token_id)["turn_exact"]
    _log(f"held-out exact after: drills {after:.3f}, in the conversation {context_after:.3f}")
    tmp = out / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model_dir, tmp, ignore=shutil.ignore_patterns("model.safetensors", "build_record.json"))
    model.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.replace(target)
    record = {"steps": steps, "learning_rate": lr, "teacher_examples": len(teacher), "recovery_episodes": len(recovery),
              "recovery_examples": len(extra),
              "drills": len(drill_train), "held_out_drills_exact": {"before": round(before, 4), "after": round(after, 4),
                                                                    "drills": len(drill_held_out)},
              "context_drills": len(context_train),
              "held_out_context_drills_exact": {"before": round(context_before, 4), "after": round(context_after, 4),
                                                "drills": len(context_held_out)},
              "seconds": round(result.seconds, 1), "final_loss": round(result.final_loss, 4),
              "skipped_long": result.skipped_long,
              "loss_curve": [round(x, 4) for x in result.losses[:: max(1, len(result.losses) // 40)]]}
    meta.write_text(json.dumps(record, indent=1))
    return record


def measure(model_dir: Path, out: Path) -> dict[str, Any]:
    from trace_common.agents.guided_probe import close_to_teacher, probe_model_dir, split_seeds
    from trace_common.agents.micro import MicroConfig

    path = out / "measure.json"
    if path.is_file():
        return json.loads(path.read_text())
    t0 = time.perf_counter()
    probe = probe_model_dir(model_dir, MicroConfig().data, split="dev", episodes=DEV_TASKS, temperatures=(0.0,))
    met, lines = close_to_teacher(probe)
    _log("criterion: " + ("MET" if met else "missed") + "\n  " + "\n  ".join(lines))
    sampled = []
    for s in range(4):
        sampled += asyncio.run(play_model(model_dir, split_seeds("dev", DEV_TASKS), 1.0, s))
    result = {"guidance_probe": probe, "criterion_met": met, "criterion": lines,
              "sampled_T1_passed": sum(t.success for t in sampled), "sampled_T1_episodes": len(sampled),
              "seconds": round(time.perf_counter() - t0, 1)}
    _log(f"T=1: {result['sampled_T1_passed']} of {len(sampled)} pass")
    path.write_text(json.dumps(result, indent=1))
    return result


def save_record(record: dict[str, Any], out: Path, json_path: Path | None) -> None:
    """Write `record` to `out`/record.json (and to `json_path` if given) and log the criterion verdict
    of its `dev` measurement (shared with micro_depth_expand)."""
    (out / "record.json").write_text(json.dumps(record, indent=1))
    if json_path:
        json_path.write_text(json.dumps(record, indent=1) + "\n")
    _log(f"done: criterion {'met' if record['dev']['criterion_met'] else 'missed'}; record in {out / 'record.json'}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=REPO / "trace_common/agents/shipped/micro")
    ap.add_argument("--out", type=Path, required=True, help="work directory (reruns resume from it)")
    ap.add_argument("--episodes", type=int, default=800, help="roll-in episodes (train tasks)")
    ap.add_argument("--recovery", type=int, default=None,
                    help="use at most this many recovery episodes (0: the teacher-only control)")
    ap.add_argument("--drills", type=int, default=0,
                    help="record-selection drills to add to the training examples (`retrieval_drills`)")
    ap.add_argument("--context-drills", type=int, default=0,
                    help="record-selection drills inside teacher conversations to add (`context_drills`)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--json", type=Path, help="write the record here too")
    ap.add_argument("--note", help="a line for the record (what else it should say)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    learner = roll_in(args.model, args.out, args.episodes)
    recovery = label(learner, args.out)
    shape = departure_shape(learner, args.out)
    if args.recovery is not None:
        recovery = recovery[:args.recovery]
    trained = train(args.model, recovery, args.out, args.steps, args.lr, args.drills, args.context_drills)
    result = measure(args.out / "model", args.out)
    departures = [t.info["first_departure"] for t in recovery]

    def mean(xs: Sequence[float]) -> float | None:
        return round(sum(xs) / len(xs), 2) if xs else None

    meta = args.out / "learner.meta.json"
    roll_in_seconds = json.loads(meta.read_text())["seconds"] if meta.is_file() else None
    record = {**code_state(), "start_model": str(args.model.relative_to(REPO) if args.model.is_relative_to(REPO)
                                                     else args.model),
              "roll_in": {"episodes": len(learner), "first_seed": FIRST_SEED, "temperature": 1.0,
                          "passed": sum(t.success for t in learner), "seconds": roll_in_seconds},
              "recovery": {"episodes": len(recovery), "passed": sum(t.success for t in recovery),
                           "mean_first_departure": mean(departures),
                           "mean_imitated_from": mean([t.info["imitate_from_turn"] for t in recovery])},
              "departures": shape, "train": trained, "dev": result, **({"note": args.note} if args.note else {})}
    save_record(record, args.out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
