"""Dev experiment for issue #31 (items 5 and 6): what could routing gain with these adapters, and
do more, greedy outcome replays make the gates use it?

Question. In every #31 run the gates sent most tokens to the base and TRACE routing played like
the base, while one adapter alone (multi-step) passed more tasks; README's reading was that the
gates are what limits TRACE now. Two things decide whether that is so: (1) how much any routing
*could* gain with these adapters -- the per-task oracle that, on each task, uses whichever single
slot (the base or one adapter alone) passes it, against GRPO on the target at TRACE's budget; and
(2) whether the outcome warm start, given labels it can learn from, routes towards what helps.

Design (fixed before the run; dev split only, the test split is never played):
- TRACE's stages: examples/demo.yaml as shipped, seed 0, run id `gatesdev` (`tracectl run --until
  gates`, as `make demo` runs it: OMP_NUM_THREADS=1, TRACE_ENVIRONMENT_VALIDATION_GROUPS=8).
- Tasks: the whole dev split of the compound store target (300 tasks), greedy, the run's one
  completion cap, one episode per task.
- Arms, each played through the run's own services (`Pipeline.rollout`):
  slots: the base, and each trained adapter alone;
  G0: TRACE token routing with the run's gates (the demo's gates config);
  G1: TRACE token routing with gates trained by the same config except the outcome warm start
      replays 64 tasks (not 16) greedily (`warm_start_temperature: 0`, as the evaluation decodes),
      so more tasks carry a label and each label says which slot scores under the evaluation's decoding;
  GRPO on the target at 1x TRACE's budget (G0's), trained as the evaluation trains it;
  G2 (added after G0's replays were seen -- 8 of its 16 tasks were ties of every slot, all labelled
      the base -- and before G1 was played): G1's settings plus `warm_start_tie_label: none`, so a
      task on which every slot scores the same gives no label instead of the base's.
- Measures: passes of 300 (Wilson 95 %); the oracle union of the slots; exact McNemar of G0 and
  G1 against the base, the best slot and GRPO 1x; per-capability sub-goal success (store subgoals);
  each composition's token shares per slot on its own dev episodes (`tracectl.run.routing`); each
  arm's training episodes.
- Reading fixed in advance: if the oracle union is below GRPO 1x, no routing over these adapters
  reaches GRPO at equal budget and the limit is the adapters and the base, not the gates; G1 (G2) is
  better than G0 (G1) only if McNemar p < 0.05 on passes (sub-goal rates are reported, not tested).

Follow-up, designed after the run above and before playing it (`--run-id lrdev --learning-rate 2e-3
--no-gate-variants`): the adapters alone replayed the base's exact conversation on 60-81 % of the dev
tasks, so do adapters that take larger steps learn more from the same episodes? The same stages and
arms (slots, G0, GRPO 1x; no G1/G2) with `training.grpo.learning_rate` 2e-3 instead of the demo's
5e-4 (4x: the smallest change expected to move the greedy policy after ~150 episodes), which GRPO on
the target trains with too (its arm reads training.grpo). Reading fixed in advance: the adapters
learn more per episode if their own-skill sub-goal rates and the oracle union rise; TRACE's ceiling
beats GRPO at equal budget only if the union passes more than GRPO 1x at the same learning rate.
G1 and G2 were then added to that run (the same command without --no-gate-variants) after its G0
was seen, with the settings fixed for the first run.

Second follow-up (2026-12-06), designed after G2 of the lrdev run was seen and before G3 was played:
G2's labels on tasks where no slot scores come from the `subrequests` share, which the multi-step
adapter wins most often while passing the fewest tasks (its own sub-goals rise, its writes against an
order's status rise too: precondition sub-goals 143 -> 97 of 196). The store's verifier now also gives
`credit`, the share zeroed by a policy violation or an unrequested change (1 exactly when the reward
is). Checked on the recorded dev slot episodes before playing (a design check on dev, not a result):
on the 265 tasks no slot passes, `subrequests` gives the multi-step adapter the most adapter labels
(32; precondition 19), `credit` the fewest but one (17; precondition 27); over all 300 dev tasks mean
credit ranks the precondition adapter first and the multi-step adapter last, as passes do (mean
`subrequests` puts the multi-step adapter above the base). G3: G2's settings with
`warm_start_fallback_score: credit`, on the lrdev run's stages. Reading fixed in advance: G3 is better
than G2 if McNemar p < 0.05 on passes; it beats GRPO 1x on dev under the same rule (GRPO 1x was trained
to G0's budget; G1-G3 replay 240 episodes more than G0, which GRPO at their budget would get too).

Every unit is recorded in `--record` as it finishes, and a rerun skips finished units, so a stopped
run resumes. docs/routing-ceiling-dev-2026-12-05.json is the record of the run of 2026-12-05,
docs/routing-ceiling-dev-lr-2026-12-05.json the follow-up's.

    OMP_NUM_THREADS=1 TRACE_ENVIRONMENT_VALIDATION_GROUPS=8 \\
        python scripts/experiments/routing_ceiling_dev.py --record /tmp/routing-ceiling.json
    OMP_NUM_THREADS=1 TRACE_ENVIRONMENT_VALIDATION_GROUPS=8 \
        python scripts/experiments/routing_ceiling_dev.py --record /tmp/routing-ceiling-lr.json \
        --run-id lrdev --learning-rate 2e-3 --no-gate-variants --work /tmp/routing-ceiling-lr
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "gatesdev"   # --run-id
DEV_TASKS = 300
G1_GATES = {"warm_start_tasks": 64, "warm_start_temperature": 0.0}
G2_GATES = {**G1_GATES, "warm_start_tie_label": "none"}
G3_GATES = {**G2_GATES, "warm_start_fallback_score": "credit"}
VARIANTS = {"G1": G1_GATES, "G2": G2_GATES, "G3": G3_GATES}


def run_config(work: Path, learning_rate: float | None) -> Path:
    """demo.yaml with run_id RUN_ID (and, when given, training.grpo.learning_rate; nothing else changed)."""
    import yaml

    cfg = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    cfg["run_id"] = RUN_ID
    if learning_rate is not None:
        cfg["training"]["grpo"]["learning_rate"] = learning_rate
    path = work / f"{RUN_ID}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


class Record:
    """The experiment's units, saved after each one (a rerun reuses them)."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"units": {}}

    lock = threading.Lock()   # two lanes record units

    def unit(self, key: str, work) -> Any:
        with self.lock:
            if key in self.data["units"]:
                print(f"[{key}] done earlier, reused", flush=True)
                return self.data["units"][key]
        started = time.time()
        print(f"[{key}] ...", flush=True)
        out = work()
        out["seconds"] = round(time.time() - started, 1)
        with self.lock:
            self.data["units"][key] = out
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1))
            tmp.replace(self.path)
        print(f"[{key}] {out.get('successes', '')} in {out['seconds']} s", flush=True)
        return out


def pipeline(config: Path):
    """The run's Pipeline on an embedded stack, as `tracectl run` builds it (a context manager)."""
    import contextlib

    from tracectl.commands.run import _store
    from tracectl.connect import Connection
    from tracectl.embedded import EMBEDDED_ENDPOINTS, allow_models_from_command
    from tracectl.run.config import load_config
    from tracectl.run.endpoints import run_endpoints
    from tracectl.run.jobs import JobRunner
    from tracectl.run.manifest import Manifest
    from tracectl.run.pipeline import Pipeline

    cfg = load_config(str(config))
    root, store = _store(cfg)
    manifest = Manifest.load(store, cfg.run_id)
    if manifest is None or manifest.stages["gates"].status != "completed":
        raise SystemExit(f"run {cfg.run_id} has not completed its gates stage")
    args = argparse.Namespace(target=[], token=None, root=Path(root.removeprefix("file://")),
                              overrides={EMBEDDED_ENDPOINTS: run_endpoints(cfg)})
    allow_models_from_command(args, cfg.base_agent.name)

    @contextlib.contextmanager
    def opened():
        with Connection(args) as conn:
            yield Pipeline(cfg, JobRunner(conn), store, manifest)
    return opened()


def play(p, policy, label: str) -> dict[str, Any]:
    from tracectl.evaluation.scoring import read_trajectories, subgoal_success

    res = p.rollout(policy, "dev", DEV_TASKS, 1, 0.0, label)
    trajs = read_trajectories(p.store, res.uri)
    sub = subgoal_success(p.store, res.uri) or {}
    return {"uri": res.uri, "episodes": res.episodes, "successes": res.successes,
            "passed": {tr.task_id: tr.reward >= 1.0 for tr in trajs},
            "subgoal": {c: [r.met, r.total] for c, r in sub.items()}}


def usage(p, composition: str, trajectories: str, name: str) -> dict[str, Any]:
    from tracectl.run.routing import routing_usage

    u, _ = routing_usage(p.stub("inference"), p.store, composition, trajectories, name=name)
    return u.model_dump() if u is not None else {}


def train_gates(p, name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The gates stage's job with `overrides` on the gates config, under its own name so it never
    resumes the run's own gate job."""
    resp, _labels = p.train_gates(name, {**p.cfg.gates.config, **overrides}, f"gate training {name}")
    return {"outputs": {o.kind: o.uri for o in resp.job.outputs}, "metrics": dict(resp.job.metrics),
            "job": resp.job.job_id}


def run(record: Record, config: Path, variants: list[str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tracectl.evaluation.stage import Evaluation

    with pipeline(config) as p:
        adapters = p.manifest.stages["adapters"].outputs
        g0 = p.manifest.stages["gates"].outputs["composition"]

        def slots_and_g0() -> None:
            record.unit("slot base", lambda: play(p, p.base_policy(), "dev base"))
            for cap, uri in sorted(adapters.items()):
                record.unit(f"slot {cap}",
                            lambda uri=uri, cap=cap: play(p, p.base_policy(adapter_uri=uri), f"dev {cap}"))
            record.unit("G0", lambda: {**play(p, p.base_policy(composition_uri=g0, routing="token"), "dev G0"),
                                       "composition": g0})
            record.unit("G0 usage", lambda: usage(p, g0, record.data["units"]["G0"]["uri"], f"{RUN_ID}-moe"))

        def grpo() -> dict[str, Any]:
            ev = Evaluation(p)   # demo.yaml's grpo_budgets: [1]; the training unit is the evaluation's own
            points, trained = ev.train_curve()
            it = points[1.0]
            adapter = trained.checkpoints.get(str(it)) or trained.uri
            episodes = trained.history.get(str(it), {}).get("rollouts_total")
            return {**play(p, p.base_policy(adapter_uri=adapter), "dev grpo 1x"), "adapter": adapter,
                    "iteration": it, "training_episodes": episodes, "trace_budget": ev.B,
                    "train_seconds": round(trained.train_seconds, 1)}
        with ThreadPoolExecutor(2) as lanes:   # two lanes, as the evaluation plays two arms at a time
            for lane in [lanes.submit(slots_and_g0), lanes.submit(lambda: record.unit("GRPO 1x", grpo))]:
                lane.result()
        if not variants:
            return

        def variant(name: str, overrides: dict[str, Any]) -> None:
            gates = record.unit(f"{name} gates", lambda: train_gates(p, f"{RUN_ID}-moe-{name.lower()}", overrides))
            comp = gates["outputs"]["composition"]
            record.unit(name, lambda: {**play(p, p.base_policy(composition_uri=comp, routing="token"), f"dev {name}"),
                                       "composition": comp})
            record.unit(f"{name} usage",
                        lambda: usage(p, comp, record.data["units"][name]["uri"], f"{RUN_ID}-moe-{name.lower()}"))

        with ThreadPoolExecutor(2) as lanes:
            for lane in [lanes.submit(variant, name, VARIANTS[name]) for name in variants]:
                lane.result()


def likeness(uris: dict[str, str]) -> dict[str, Any]:
    """Per arm, from its stored episodes: the mean share of sub-requests fulfilled, and on how many
    tasks it played exactly the base's conversation (every message the same): how far an adapter or
    a composition moves the policy at all."""
    from trace_common.artifacts import open_store
    from tracectl.evaluation.scoring import read_trajectories

    def episodes(uri: str) -> dict[str, Any]:
        if "://" not in uri:   # a published record's path, relative to the checkout
            uri = (REPO / uri).as_uri()
        root = uri.split("/runs/")[0]
        return {tr.task_id: tr for tr in read_trajectories(open_store(root), uri)}

    base = episodes(uris["slot base"])
    out = {}
    for name, uri in uris.items():
        eps = episodes(uri)
        same = sum(1 for k, tr in eps.items() if k in base and tr.messages == base[k].messages)
        share = sum(float(tr.reward_breakdown.get("subrequests", 0.0)) for tr in eps.values()) / max(1, len(eps))
        out[name] = {"same_as_base": same, "of": len(eps), "subrequest_share": round(share, 4)}
    return out


def analyse(record: Record) -> dict[str, Any]:
    """Passes, the oracle union, paired tests and sub-goal rates from the recorded units."""
    from trace_common.stats import mcnemar_exact, paired_counts, wilson_interval

    u = record.data["units"]
    arms = {k: v for k, v in u.items() if "passed" in v}
    tasks = sorted(u["slot base"]["passed"], key=int)
    slots = [k for k in arms if k.startswith("slot ")]
    outcome = {k: [bool(v["passed"].get(task, False)) for task in tasks] for k, v in arms.items()}
    outcome["oracle union of slots"] = [any(outcome[s][i] for s in slots) for i in range(len(tasks))]
    best_slot = max(slots, key=lambda s: (sum(outcome[s]), s == "slot base"))
    table = {}
    for name, xs in outcome.items():
        lo, hi = wilson_interval(sum(xs), len(xs))
        row: dict[str, Any] = {"passed": sum(xs), "of": len(xs), "ci": [round(lo, 3), round(hi, 3)]}
        if name in arms:
            row["subgoal"] = arms[name]["subgoal"]
        table[name] = row
    paired = {}
    for a in ("G0", *VARIANTS, "oracle union of slots"):
        for b in ("slot base", best_slot, "GRPO 1x", "G0", *VARIANTS, "oracle union of slots"):
            if a in outcome and b in outcome and a != b:
                _, only_a, only_b, _ = paired_counts(outcome[a], outcome[b])
                paired[f"{a} vs {b}"] = {"only_first": only_a, "only_second": only_b,
                                         "mcnemar_p": round(mcnemar_exact(only_a, only_b), 5)}
    try:
        like = likeness({k: v["uri"] for k, v in arms.items() if "uri" in v})
    except Exception as err:   # noqa: BLE001 -- the episodes are gone (another machine): say so, keep the rest
        like = {"unavailable": str(err)[:200]}
    return {"tasks": len(tasks), "best_slot": best_slot, "arms": table, "paired": paired, "likeness": like,
            "usage": {k.removesuffix(" usage"): v for k, v in u.items() if k.endswith(" usage")},
            "grpo_1x": {k: u["GRPO 1x"].get(k) for k in ("training_episodes", "trace_budget", "iteration",
                                                          "train_seconds")} if "GRPO 1x" in u else None,
            "gates_metrics": {g: u[f"{g} gates"].get("metrics") for g in VARIANTS if f"{g} gates" in u},
            "seconds": {k: v.get("seconds") for k, v in u.items()}}


def main() -> int:
    global RUN_ID
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, required=True, help="the experiment's units (resumable JSON)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/routing-ceiling"), help="the run config's folder")
    parser.add_argument("--analyse-only", action="store_true", help="only summarise the recorded units")
    parser.add_argument("--run-id", default=RUN_ID, help="the run's id (its stages are reused when it exists)")
    parser.add_argument("--learning-rate", type=float, help="training.grpo.learning_rate (default: demo.yaml's)")
    parser.add_argument("--no-gate-variants", action="store_true", help="slots, G0 and GRPO 1x only")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"the gate variants to play, comma-separated (of {', '.join(VARIANTS)}; default all)")
    parser.add_argument("--publish", type=Path, help="also write the record here, its paths relative to the checkout")
    args = parser.parse_args()
    os.chdir(REPO)   # the run's store is the checkout's ./.trace, as for make demo
    RUN_ID = args.run_id
    args.work.mkdir(parents=True, exist_ok=True)
    record = Record(args.record)
    variants = [] if args.no_gate_variants else [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; expected some of {', '.join(VARIANTS)}")
    if not args.analyse_only:
        config = run_config(args.work, args.learning_rate)
        done = subprocess.call([str(REPO / ".venv" / "bin" / "tracectl"), "run", "--config", str(config),
                                "--until", "gates"], cwd=REPO)
        if done:
            return done
        run(record, config, variants)
    record.data["analysis"] = analyse(record)
    args.record.write_text(json.dumps(record.data, indent=1))
    if args.publish:   # the artifacts' URIs name this machine's checkout: keep them relative in a committed copy
        text = json.dumps(record.data, indent=1).replace(f"file://{REPO}/", "").replace(str(REPO), ".")
        args.publish.write_text(text + "\n")
    print(json.dumps(record.data["analysis"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
