"""A run's records are read through their typed model (tracectl/run/results.py): no tracectl module
reads an arm or stage record by a string key, and manifests written before the model existed
load and render the report they rendered then."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import grpc
import pytest
from pydantic import BaseModel

from tracectl.run import results as R
from tracectl.run.config import RunConfig
from tracectl.run.manifest import Manifest
from tracectl.run.report import render_markdown

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures"

#: Names a record shares with things that are not run records, and what those are: reading them by
#: key is reading that other thing. Only these are left out of the scan.
OTHER_MEANINGS = {
    "name": "a check, a tool call, an artifact", "uri": "an artifact reference of a service's report",
    "source": "an agent's build metadata", "total": "a tau2 download's state",
    "iteration": "a row of the trainer's metrics file", "iterations": "the trainer's metrics file; GEPA's state",
    "capability": "a trajectory's info (the environment's)", "capabilities": "a trajectory's info",
    "task_type": "a trajectory's info", "adapter": "a job's output kind", "tensorboard": "a job's output kind",
}


def _model_fields() -> set[str]:
    """Every field name (and accepted older name) of the records model, except the trainer's own
    config fields and metric names (reading a trainer config or metrics row is not reading a record)."""
    from services.trainer.configs import config_model

    trainer = set(R.JobTotals.model_fields)
    for kind in ("TRAINING_KIND_ADAPTER", "TRAINING_KIND_GATES"):
        trainer |= set(config_model(kind).model_fields)
    names: set[str] = set()
    for model in vars(R).values():
        if inspect.isclass(model) and issubclass(model, BaseModel) and model.__module__ == R.__name__:
            for name, f in model.model_fields.items():
                names.add(name)
                names |= set(getattr(f.validation_alias, "choices", ()))
    return names - trainer - set(OTHER_MEANINGS)


#: Where a record field name is read by key from something that is no record (the expression read).
NOT_RECORDS = {
    ("tracectl/commands/train.py", "v"): "the trainer's live iteration metrics (a proto map)",
}


def string_key_reads(source: str) -> list[tuple[int, str, str]]:
    """(line, key, expression) of every `x["key"]` and `x.get("key", ...)` read in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
            out.append((node.lineno, node.slice.value, ast.unparse(node.value)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value, ast.unparse(node.func.value)))
    return out


def record_reads(path: str, source: str, fields: set[str]) -> list[str]:
    return [f"{path}:{line}: {expr}[{key!r}]" for line, key, expr in string_key_reads(source)
            if key in fields and (path, expr) not in NOT_RECORDS]


@pytest.mark.parametrize(("source", "flagged"), [
    ('arm["training_episodes"]', True),
    ('ev.get("grpo_curve", [])', True),
    ('arm["training_rollouts"]', True),                 # an older name counts too
    ('rec.result.get("environments")', True),
    ('out["outputs"]', True),                           # a stage's outcome is a record too
    ("arm.training_episodes", False),
    ('metrics.get("rollouts_total")', False),           # the trainer's metric name
    ('grpo["groups_per_batch"]', False),                # a trainer config field
    ('tr.info.get("capability")', False),
    ('arm["training_episodes"] = 3', False),            # a write builds a record; it does not read one
])
def test_the_scan_finds_a_record_read_by_key(source, flagged):
    assert bool(record_reads("tracectl/x.py", source, _model_fields())) is flagged


def test_no_tracectl_module_reads_a_record_by_string_key():
    fields = _model_fields()
    found = []
    for path in sorted((REPO / "tracectl").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel != "tracectl/run/results.py":
            found += record_reads(rel, path.read_text(), fields)
    assert not found, "read these through tracectl/run/results.py:\n" + "\n".join(found)


@pytest.mark.parametrize(("manifest", "subgoals", "expected"), [
    ("plan/demo-seed1-manifest.json", "report/demo-seed1-subgoals.json", "report/demo-seed1-report.md"),
])
def test_a_manifest_written_before_the_model_renders_the_same_report(manifest, subgoals, expected):
    """make demo's seed-1 manifest (written by commit 2688290, old key names) and its report as that
    commit's code rendered it; the plots are present (their bytes are not compared here)."""
    m = Manifest.model_validate(json.loads((FIXTURES / manifest).read_text()))
    assert "training_rollouts" in json.dumps(m.stages["evaluation"].result)     # the older names
    cfg = RunConfig.model_validate(m.config)
    sg = {arm: {c: R.SubgoalRate.model_validate(v) for c, v in rates.items()}
          for arm, rates in json.loads((FIXTURES / subgoals).read_text()).items()}
    plots = dict.fromkeys(("pass_rate_per_arm", "subgoal_success", "candidates", "training_curves",
                           "sample_efficiency", "expert_usage"), b"png")
    assert render_markdown(cfg, m, plots, {}, sg, None) == (FIXTURES / expected).read_text()


@pytest.mark.parametrize("manifest", ["plan/demo-seed1-manifest.json", "plan/quick-manifest.json"])
def test_older_records_load_whole_and_round_trip(manifest):
    """Every stage's result of a stored run loads into its model, old names mapped to new ones and
    nothing the model does not declare lost."""
    m = Manifest.model_validate(json.loads((FIXTURES / manifest).read_text()))
    for stage, model in R.STAGE_RESULTS.items():
        stored = m.stages[stage].result
        typed = model.model_validate(stored)
        again = model.model_validate(R.dump(typed))
        assert again == typed, stage
    ev = R.results_of(m).evaluation
    old = m.stages["evaluation"].result
    assert ev.trace_budget_episodes == old["trace_training_rollouts"] == ev.budget.total_episodes
    for name, arm in ev.arms.items():
        assert arm.training_episodes == old["arms"][name]["training_rollouts"], name
        assert arm.pass_rate == old["arms"][name]["pass_rate"], name
    assert [p.training_episodes for p in ev.grpo_curve] == [p.get("training_rollouts") for p in old["grpo_curve"]]


class _Refused(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "gates.config.max_stepz: unknown field"


@pytest.mark.parametrize(("code", "raised", "fragment"), [
    (grpc.StatusCode.INVALID_ARGUMENT, "InvalidArgument", "max_stepz"),
    (grpc.StatusCode.UNIMPLEMENTED, "StageFailed", "update the trainer"),
    (grpc.StatusCode.UNAVAILABLE, "_Refused", ""),               # anything else: as the trainer said it
])
def test_a_config_the_trainer_cannot_parse_stops_the_count_saying_why(code, raised, fragment):
    from types import SimpleNamespace

    from tracectl.run.pipeline import Pipeline

    def refuse(request):
        raise _Refused(code)
    runner = SimpleNamespace(conn=SimpleNamespace(stub=lambda name: SimpleNamespace(ValidateTrainingConfig=refuse)))
    p = Pipeline(RunConfig(run_id="x"), runner=runner, store=None, manifest=Manifest(run_id="x"))
    with pytest.raises(Exception) as err:
        p.parsed_config(1, "gates.config", {"max_stepz": 3})
    assert type(err.value).__name__ == raised and fragment in str(err.value)


@pytest.mark.parametrize(("unexplained", "line"), [
    (None, None),                                                      # an older run: no such line
    ({"failed": 0, "by_retained": 0, "by_candidates": 0}, None),       # nothing failed
    ({"failed": 120, "by_retained": 30, "by_candidates": 12},
     "Failures no capability explains: 30 of 120 failed rollout episodes (25%) lack none of the retained "
     "capabilities (12, 10%, none of the candidates)"),
])
def test_the_report_states_the_failures_no_capability_explains(unexplained, line):
    raw = json.loads((FIXTURES / "plan/demo-seed1-manifest.json").read_text())
    if unexplained is not None:
        raw["stages"]["analysis"]["result"]["unexplained_failures"] = unexplained
    m = Manifest.model_validate(raw)
    cfg = RunConfig.model_validate(m.config)
    plots = dict.fromkeys(("pass_rate_per_arm", "subgoal_success", "candidates", "training_curves",
                           "sample_efficiency", "expert_usage"), b"png")
    md = render_markdown(cfg, m, plots, {}, {}, None)
    section = md[md.index("## Capability analysis"):md.index("## Stages")]
    if line is None:
        assert "Failures no capability explains" not in section
    else:
        assert line in section
