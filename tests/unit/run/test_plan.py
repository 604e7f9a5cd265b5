"""`tracectl run --plan` (tracectl/run/plan.py), checked against finished runs: for the manifests of a
finished examples/quick.yaml run and a finished `make demo` run (tests/fixtures/plan/), the plan made
from the config each manifest carries plays exactly the manifest's episodes in every row it calls
deterministic, and no more than its worst case in the others (the report's accounting:
evaluation/budget.py's trace_budget and the evaluation's arm records). Then the counting rules on hand-computed
cases, the numbers plan.py states for the environment service (it may not import it) against the
service's code, the settings' and the config's bad values, and the command itself against a stack.
"""

from __future__ import annotations

import io
import math
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from trace_common.domains.store import SPLITS
from trace_common.errors import InvalidArgument
from tracectl.run import plan as P
from tracectl.run.config import RunConfig, grpo_target_config
from tracectl.run.manifest import Manifest

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "plan"
SIZES = {name: len(seeds) for name, seeds in SPLITS.items()}
#: A profile and throughput that make the token and GPU-hour arithmetic checkable by hand.
EVEN = P.PlanSettings(rollout_tokens_per_gpu_s=1000.0, training_tokens_per_gpu_s=500.0, turns_per_episode=10,
                      prompt_tokens_per_turn=100, completion_tokens_per_turn=20)


def parsed(kind: str, values: dict[str, Any]) -> dict[str, Any]:
    """A GRPO config as ValidateTrainingConfig answers it: the trainer's model, through a Struct."""
    from services.trainer.configs import validate_training_config

    s = Struct()
    s.update(validate_training_config(kind, values).model_dump(mode="json"))
    return MessageToDict(s)


def facts(cfg: RunConfig, groups: int = 16, group_size: int = 8, sizes: dict[str, int] | None = None) -> P.Facts:
    return P.Facts(grpo=parsed("TRAINING_KIND_ADAPTER", cfg.training.grpo),
                   grpo_target=parsed("TRAINING_KIND_ADAPTER", grpo_target_config(cfg.training.grpo)),
                   gates=parsed("TRAINING_KIND_GATES", cfg.gates.config), split_sizes=SIZES if sizes is None else sizes,
                   calibration={"groups": groups, "group_size": group_size, "default_max_retries": 3},
                   calibration_source="test")


def config(**change: Any) -> RunConfig:
    data = yaml.safe_load((REPO / "examples" / "quick.yaml").read_text())
    for section, value in change.items():
        data[section] = {**data[section], **value} if isinstance(value, dict) and section in data else value
    return RunConfig.model_validate(data)


# -- against finished runs ---------------------------------------------------------------------------
#: fixture -> the calibration settings its environment service had: the quick run was made with no
#: TRACE_ENVIRONMENT_VALIDATION_* set (the service's 16 x 8); `make demo` sets GROUPS=8 (Makefile).
RUNS = {"quick-manifest.json": {"groups": 16, "group_size": 8},
        "demo-seed1-manifest.json": {"groups": 8, "group_size": 8}}


def finished(name: str) -> Manifest:
    path = FIXTURES / name
    if not path.is_file():   # never skipped: a missing fixture fails, saying how to make it
        pytest.fail(f"{path} is missing: copy a finished run's manifest there (.trace/runs/<run_id>/manifest.json "
                    "of `tracectl run --config examples/quick.yaml`, or of `make demo` for demo-seed1-manifest.json), "
                    "its URIs' absolute paths of this machine replaced (no tracked file cites one: "
                    "tests/unit/test_import_rules.py)")
    return Manifest.model_validate_json(path.read_text())


def actual(m: Manifest) -> dict[str, int]:
    """Every plan row's count in a finished run, as the report accounts it."""
    ev = m.stages["evaluation"].result
    c = ev["budget"]["components"]
    out = {"rollout": c["rollout"]["episodes"], "calibration": c["calibration"]["episodes"],
           "adapters": c["adapters"]["episodes"], "gates: warm start": c["gates"]["warm_start_episodes"],
           "gates: GRPO": c["gates"]["grpo_episodes"], "B": ev["budget"]["total_episodes"]}
    cap = m.stages["rollout"].result["max_completion_length"]
    if cap.get("source") == "derived":
        out["completion cap"] = cap["expert_episodes"]
    for name, arm in {**ev["arms"], **ev.get("grpo_curve_points", {})}.items():
        out[f"{name}: test"] = arm["episodes"]
        if "probes" in arm:
            out[f"{name}: probes"] = arm["probes"]["episodes"]
        if "dev_episodes" in arm:
            out[f"{name}: dev"] = arm["dev_episodes"]
    for point in ev.get("grpo_curve", []):
        out[f"curve {point['multiple']:g}x"] = point["training_rollouts"]
    if ev.get("grpo_curve"):   # the curve job trains to its last point: the whole run's episodes
        out["grpo_target: training"] = max(p["training_rollouts"] for p in ev["grpo_curve"])
    return out


def planned(m: Manifest) -> P.Plan:
    cfg = RunConfig.model_validate(m.config)
    return P.make_plan(cfg, facts(cfg, **RUNS[_name_of(m)]), EVEN)


def _name_of(m: Manifest) -> str:
    return f"{m.run_id}-manifest.json"


def plan_rows(p: P.Plan) -> dict[str, tuple[int, int, bool]]:
    rows = {r.name: (r.episodes, r.worst, r.deterministic) for r in [*p.stages, *p.arms]}
    rows["B"] = (p.budget, p.budget_worst, False)
    rows.update({f"curve {c.multiple:g}x": (c.episodes, c.worst, False) for c in p.curve})
    return rows


#: (fixture, row, deterministic?): every row of each run's plan; deterministic rows must equal the run.
CASES = [
    *[("quick-manifest.json", row, det) for row, det in [
        ("completion cap", True), ("rollout", True), ("calibration", False), ("adapters", False),
        ("gates: warm start", True),             # K = 1 (max_capabilities 1): 4 tasks x 2 slots
        ("gates: GRPO", False), ("B", False),
        ("base: test", True), ("base: probes", True), ("best_single: dev", True), ("best_single: test", True),
        ("best_single: probes", True), ("grpo_target: training", False), ("grpo_target@0.5x: test", True),
        ("grpo_target: test", True), ("grpo_target: probes", True), ("trace_routing: test", True),
        ("trace_routing: probes", True), ("trace_per_request: test", True), ("trace_per_request: probes", True),
        ("curve 0.5x", False), ("curve 1x", False)]],
    *[("demo-seed1-manifest.json", row, det) for row, det in [
        ("completion cap", True), ("rollout", True), ("calibration", False), ("adapters", False),
        ("gates: warm start", False),            # 16 x (K+1): K is 1 to 4
        ("gates: GRPO", False), ("B", False),
        ("trace_routing: test", True), ("trace_routing: probes", True), ("base: test", True),
        ("base: probes", True), ("grpo_target: training", False), ("grpo_target: test", True),
        ("grpo_target: probes", True), ("best_single: dev", False), ("best_single: test", True),
        ("best_single: probes", True), ("curve 1x", False)]],
]


@pytest.mark.parametrize("fixture", sorted(RUNS))
def test_the_plan_has_a_row_for_everything_the_run_played(fixture):
    m = finished(fixture)
    assert set(plan_rows(planned(m))) == set(actual(m)) == {row for f, row, _ in CASES if f == fixture}


@pytest.mark.parametrize("fixture, row, deterministic", CASES, ids=[f"{f.split('-')[0]}:{r}" for f, r, _ in CASES])
def test_the_plan_against_a_finished_run(fixture, row, deterministic):
    m = finished(fixture)
    nominal, worst, det = plan_rows(planned(m))[row]
    got = actual(m)[row]
    assert det is deterministic
    if deterministic:
        assert got == nominal == worst
    else:
        assert got <= worst, f"{row}: the run played {got}, above the plan's worst case {worst}"


# -- the counting rules, by hand -----------------------------------------------------------------------
@pytest.mark.parametrize("grpo, groups, size, batches, expected", [
    # make demo's adapters: 8 seeds x (8 // 8) = 8 calibration groups fill 2 of 4 iterations of 4 groups
    ({"max_steps": 4, "groups_per_batch": 4, "num_generations": 8, "max_resample_rounds": 2}, 8, 8, True,
     (2 * 32, 2 * 32 * 3 + 2 * 8 * 8, 64, 4)),
    # quick.yaml under 16 x 8: 16 x (8 // 4) = 32 groups fill 16 iterations of 2 > max_steps 3: raised, none played
    ({"max_steps": 3, "groups_per_batch": 2, "num_generations": 4, "max_resample_rounds": 1}, 16, 8, True,
     (0, 1 * 32 * 4, 128, 16)),
    # no calibration batches (an HTTP backend without token ids): every iteration plays
    ({"max_steps": 3, "groups_per_batch": 2, "num_generations": 4, "max_resample_rounds": 1}, 16, 8, False,
     (24, 48, 0, 3)),
    # a group size that is no multiple of num_generations: the batches cannot be split into groups
    ({"max_steps": 3, "groups_per_batch": 2, "num_generations": 4, "max_resample_rounds": 0}, 4, 6, True,
     (24, 24, 0, 3)),
])
def test_one_adapter_job(grpo, groups, size, batches, expected):
    assert P._adapter(grpo, groups, size, batches) == expected


@pytest.mark.parametrize("change, nominal, worst", [
    ({}, 1 * 16 * 8, 1 * P.LIBRARY_MAX_LEVELS * 16 * 8),                                     # library levels
    ({"analysis": {"max_capabilities": 3}}, 3 * 128, 3 * P.LIBRARY_MAX_LEVELS * 128),
    # llm mode: 1 + max_retries attempts; max_retries 0 is the service's default (3), as the service reads it
    ({"environments": {"mode": "llm", "max_retries": 2, "llm": {"base_url": "http://x/v1", "model": "m"}}},
     128, 3 * 128),
    ({"environments": {"mode": "llm", "max_retries": 0, "llm": {"base_url": "http://x/v1", "model": "m"}}},
     128, 4 * 128),
])
def test_calibration_attempts(change, nominal, worst):
    cfg = config(**change)
    row = P.make_plan(cfg, facts(cfg), EVEN).row("calibration")
    assert (row.episodes, row.worst, row.deterministic) == (nominal, worst, False)


@pytest.mark.parametrize("change, row, nominal, worst", [
    ({"rollout": {"limit": 200_000}}, "rollout", 100_000 * 2, 100_000 * 2),   # at most the split's size
    ({"evaluation": {"limit": 0}}, "base: test", 600, 600),                  # 0: the whole split
    ({"evaluation": {"limit": 5000}}, "base: test", 600, 600),               # at most the split's size
    ({"evaluation": {"probe_limit": 0}}, "base: probes", None, None),        # no probes: no row
    # tau2's pass^k: every test task k times (sampled), probes and dev runs once
    ({"evaluation": {"trials": 3, "temperature": 1.0}}, "trace_routing: test", 24 * 3, 24 * 3),
    ({"evaluation": {"trials": 3, "temperature": 1.0}}, "trace_routing: probes", 8, 8),
    ({"evaluation": {"trials": 3, "temperature": 1.0}}, "best_single: dev", 24, 24),
    # provenance labels: K adapters x warm_start_episodes, GRPO 1 x 2 x 4 with 1 round
    ({"gates": {"config": {"max_steps": 1, "groups_per_batch": 2, "num_generations": 4, "max_resample_rounds": 1,
                           "warm_start_labels": "provenance", "warm_start_episodes": 5}},
      "analysis": {"max_capabilities": 3}}, "gates: warm start", 15, 15),
    ({"gates": {"config": {"max_steps": 1, "groups_per_batch": 2, "num_generations": 4, "max_resample_rounds": 1}}},
     "gates: GRPO", 8, 16),
    ({"gates": {"config": {"max_steps": 1, "warm_start_steps": 0}}}, "gates: warm start", 0, 0),
    ({"evaluation": {"arms": ["base", "gepa"], "gepa": {"base_url": "http://x/v1", "model": "m"}}},
     "gepa: optimisation", "B", "B worst"),
])
def test_rows(change, row, nominal, worst):
    cfg = config(**change)
    p = P.make_plan(cfg, facts(cfg), EVEN)
    if nominal is None:
        assert row not in {r.name for r in p.arms}
        return
    got = p.row(row)
    expect = {"B": p.budget, "B worst": p.budget_worst}
    assert (got.episodes, got.worst) == (expect.get(nominal, nominal), expect.get(worst, worst))


@pytest.mark.parametrize("grpo, varies", [
    # 2 calibration groups fill iteration 1; 3 more play 2 x 4, nothing re-collected, no early stop (4 <= 5)
    ({"max_steps": 4, "groups_per_batch": 2, "num_generations": 4, "max_resample_rounds": 0}, []),
    # 10 iterations: an early stop after 5 uninformative ones can cut the last
    ({"max_steps": 10, "groups_per_batch": 2, "num_generations": 4, "max_resample_rounds": 0}, ["early stop after 5"]),
    ({"max_steps": 10, "groups_per_batch": 2, "num_generations": 4, "max_resample_rounds": 0,
      "early_stop_uninformative_iterations": 0}, []),
    ({"max_steps": 4, "groups_per_batch": 2, "num_generations": 4, "max_resample_rounds": 2},
     ["re-collection rounds (up to 2)"]),
])
def test_what_makes_the_adapters_row_vary(grpo, varies):
    cfg = config(training={"grpo": grpo})
    row = P.make_plan(cfg, facts(cfg, groups=2, group_size=4), EVEN).row("adapters")
    assert [v for v in row.varies if not any(v.startswith(w) for w in varies)] == []
    assert len(row.varies) == len(varies)
    if not varies:   # deterministic: (max_steps - 1) iterations of 2 x 4 each
        assert row.episodes == row.worst == (grpo["max_steps"] - 1) * 8


def test_the_budget_curve_and_the_budget():
    cfg = config()
    p = P.make_plan(cfg, facts(cfg), EVEN)
    stages = {r.name: r for r in p.stages}
    assert p.budget == sum(r.episodes for r in p.stages if r.in_budget) and not stages["completion cap"].in_budget
    assert p.budget_worst == sum(r.worst for r in p.stages if r.in_budget)
    # quick.yaml: 8 episodes an iteration (2 x 4), it(m) = ceil(m B / 8); worst: at B worst (GRPO on the
    # target never re-collects: grpo_target_config)
    for point in p.curve:
        assert point.iterations == max(1, math.ceil(point.multiple * p.budget / 8))
        assert point.worst == max(1, math.ceil(point.multiple * p.budget_worst / 8)) * 8
    assert p.row("grpo_target: training").episodes == p.curve[-1].episodes


def test_tokens_and_gpu_hours_from_the_turn_lengths_and_throughput():
    cfg = config()
    p = P.make_plan(cfg, facts(cfg), EVEN)
    roll = p.row("rollout")                       # 64 episodes x 10 turns x (100 + 20) at 1000 tokens/s
    assert (roll.prompt_tokens, roll.completion_tokens) == (64 * 1000, 64 * 200)
    assert roll.gpu_hours == pytest.approx(64 * 1200 / 1000 / 3600)
    adapters = p.row("adapters")                  # 0 played, 128 calibration episodes trained on, at 500/s
    assert adapters.gpu_hours == pytest.approx(128 * 1200 / 500 / 3600)
    assert adapters.gpu_hours_worst == pytest.approx((128 + 128) * 1200 / 500 / 3600)
    assert p.row("completion cap").gpu_hours == 0.0
    assert p.trace_gpu_hours == pytest.approx(sum(r.gpu_hours for r in p.stages if r.in_budget))
    unknown = P.make_plan(config(target={"env": "tau2-retail"}, max_completion_length={"tokens": 64, "reason":
                                 "a test of a target without measured turns"}),
                          facts(cfg), P.PlanSettings(rollout_tokens_per_gpu_s=1.0, training_tokens_per_gpu_s=1.0))
    assert unknown.row("rollout").prompt_tokens is None and unknown.trace_gpu_hours is None


def test_the_measured_defaults_are_the_quick_runs():
    """The turn lengths and throughputs plan.py states were measured on the quick fixture's run."""
    m = finished("quick-manifest.json")
    ev = m.stages["evaluation"].result
    roll = ev["budget"]["components"]["rollout"]
    turns = P.MEASURED_TURNS[("store", "micro")]
    assert turns.turns * turns.prompt_tokens * roll["episodes"] == pytest.approx(roll["prompt_tokens"])
    assert turns.turns * turns.completion_tokens * roll["episodes"] == pytest.approx(roll["completion_tokens"])
    wall = m.stages["rollout"].result["wall_seconds"]
    assert P.ROLLOUT_TOKENS_PER_GPU_S == pytest.approx((roll["prompt_tokens"] + roll["completion_tokens"]) / wall,
                                                       abs=0.5)
    curve = ev["arms"]["grpo_target"]
    assert P.TRAINING_TOKENS_PER_GPU_S == pytest.approx(curve["training_tokens"] / curve["train_seconds"], abs=0.5)


# -- what plan.py states for the environment service --------------------------------------------------
def test_the_environment_service_numbers_plan_states():
    from services.environment import library
    from services.environment.settings import EnvironmentSettings

    assert P.LIBRARY_MAX_LEVELS == max(len(library.levels(f)) for f in library.FAMILIES)
    fields = EnvironmentSettings.model_fields
    for key, (var, default) in P.CALIBRATION_SETTINGS.items():
        name = {"groups": "validation_groups", "group_size": "validation_group_size"}.get(key, key)
        assert fields[name].default == default and var == f"TRACE_ENVIRONMENT_{name.upper()}"


@pytest.mark.parametrize("services, environ, expected", [
    ({}, {}, {"groups": 16, "group_size": 8, "default_max_retries": 3}),
    ({}, {"TRACE_ENVIRONMENT_VALIDATION_GROUPS": "8"}, {"groups": 8, "group_size": 8, "default_max_retries": 3}),
    # a deployed environment service reads its own environment, not this one
    ({"environment": "h:1"}, {"TRACE_ENVIRONMENT_VALIDATION_GROUPS": "8"},
     {"groups": 16, "group_size": 8, "default_max_retries": 3}),
    ({}, {"TRACE_ENVIRONMENT_VALIDATION_GROUP_SIZE": "many"}, "TRACE_ENVIRONMENT_VALIDATION_GROUP_SIZE"),
    ({}, {"TRACE_ENVIRONMENT_VALIDATION_GROUPS": "0"}, "TRACE_ENVIRONMENT_VALIDATION_GROUPS"),
])
def test_calibration_settings(services, environ, expected):
    cfg = config(services=services)
    if isinstance(expected, str):
        with pytest.raises(InvalidArgument, match=expected):
            P.calibration_settings(cfg, environ)
        return
    assert P.calibration_settings(cfg, environ)[0] == expected


@pytest.mark.parametrize("environ, fragment", [
    ({"TRACE_PLAN_ROLLOUT_TOKENS_PER_GPU_S": "fast"}, "TRACE_PLAN_ROLLOUT_TOKENS_PER_GPU_S"),
    ({"TRACE_PLAN_TRAINING_TOKENS_PER_GPU_S": "-3"}, "TRACE_PLAN_TRAINING_TOKENS_PER_GPU_S"),
    ({"TRACE_PLAN_TURNS_PER_EPISODE": "0"}, "TRACE_PLAN_TURNS_PER_EPISODE"),
])
def test_a_bad_setting_is_named(environ, fragment):
    with pytest.raises(InvalidArgument, match=fragment):
        P.plan_settings(environ)


def test_settings_replace_the_defaults_and_say_so():
    s = P.plan_settings({"TRACE_PLAN_ROLLOUT_TOKENS_PER_GPU_S": "2500"})
    assert s.rollout_tokens_per_gpu_s == 2500 and s.training_tokens_per_gpu_s == P.TRAINING_TOKENS_PER_GPU_S
    cfg = config()
    sources = {a.name: a.source for a in P.make_plan(cfg, facts(cfg), s).assumptions}
    assert sources["rollout throughput (tokens/s per GPU)"] == "TRACE_PLAN_ROLLOUT_TOKENS_PER_GPU_S"
    assert sources["training throughput (tokens/s per GPU)"] == P.THROUGHPUT_SOURCE


@pytest.mark.parametrize("change, sizes, fragment", [
    # sizes unknown (a target the rollout service lists without them): the whole split cannot be counted
    ({"evaluation": {"limit": 0}}, {}, "evaluation.limit: expected a limit"),
    # a split the target lacks (tau2 retail has train and test only): the run would fail there
    ({}, {"train": 74, "test": 40}, "best_single"),
    ({"rollout": {"split": "validation"}}, SIZES, "rollout.split"),
])
def test_a_split_the_plan_cannot_count_is_named(change, sizes, fragment):
    cfg = config(**change)
    with pytest.raises(InvalidArgument, match=fragment):
        P.make_plan(cfg, facts(cfg, sizes=sizes), EVEN)


def test_render_prints_every_row():
    cfg = config()
    p = P.make_plan(cfg, facts(cfg), EVEN)
    out = io.StringIO()
    P.render(p, "quick.yaml", file=out)
    text = out.getvalue()
    assert "TRACE's budget B" in text and all(r.name.split(":")[0] in text for r in [*p.stages, *p.arms])


# -- the command --------------------------------------------------------------------------------------
@pytest.mark.integration   # starts the embedded services in this process
@pytest.mark.parametrize("change, environ, code, fragment", [
    ({}, {}, 0, "TRACE's budget B"),
    # a config that deploys services and an S3 store: planned offline, nothing of the deployment is called
    ({"services": {"trainer": "nowhere.invalid:1", "rollout": "nowhere.invalid:2"},
      "store": {"root": "s3://bucket", "s3_endpoint": "nowhere.invalid:9000"}}, {}, 0, "TRACE's budget B"),
    ({"evaluation": {"limit": 24, "dev_limit": 24, "arms": ["base", "grpo_tagret"]}}, {}, 2, "evaluation.arms"),
    ({"training": {"grpo": {"max_stepz": 3}}}, {}, 2, "training.grpo"),
    ({}, {"TRACE_PLAN_ROLLOUT_TOKENS_PER_GPU_S": "fast"}, 2, "TRACE_PLAN_ROLLOUT_TOKENS_PER_GPU_S"),
])
def test_the_command(tmp_path, monkeypatch, capsys, change, environ, code, fragment):
    from tracectl.cli import main

    data = yaml.safe_load((REPO / "examples" / "quick.yaml").read_text())
    data.update(run_id=f"plan-{uuid.uuid4().hex[:8]}", **change)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    assert main(["run", "--config", str(path), "--plan"]) == code
    out, err = capsys.readouterr()
    assert fragment in (out if code == 0 else err) and "Traceback" not in out + err
    assert [p.name for p in tmp_path.iterdir()] == ["run.yaml"]     # no store, no manifest: nothing written
