"""A run whose analysis retains no capability, or whose environments stage accepts none
(analysis.on_no_capability): "stop" fails that stage as before; "baselines" completes it and the
later TRACE stages empty -- no job created, each saying why in one console line and in its record --
counts TRACE's budget from what it did play, evaluates only the arms that need no adapter, and
renders a report that names every arm it did not play.

The stages run on the real Pipeline over a real store; only the services are stood in for
(`Services`: the analysis, environment and trainer answers; the evaluation's stand-ins are
tests/unit/run/fakes.py's)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from tests.unit.run.fakes import FakeEvalPipeline, report, rollout_stage_records, trajectory
from trace_common.artifacts import open_store
from trace_common.errors import InvalidArgument
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.evaluation.budget import trace_budget
from tracectl.evaluation.stage import evaluate
from tracectl.run.config import RunConfig, load_config
from tracectl.run.jobs import StageFailed
from tracectl.run.manifest import Manifest, config_hash
from tracectl.run.pipeline import Pipeline
from tracectl.run.report import write_report
from tracectl.run.results import StageOutcome, results_of

A, E, T = (messages(s) for s in ("analysis", "environment", "trainer"))
TRACE_STAGES = ("analysis", "environments", "adapters", "gates")
ADAPTER_ARMS = ["best_single", "trace_routing", "trace_per_request", "trace_soft"]
GRPO = {"groups_per_batch": 2, "num_generations": 4, "max_steps": 3, "save_steps": 2}
SUFFIX = "(analysis.on_no_capability: baselines)"


class Services:
    """Stand-in for JobRunner + Connection: the analysis finds `candidates` (name -> retained), the
    environment service answers `environments` (capability -> accepted), the trainer parses configs
    with its own models. Every job is recorded in `jobs`; a training job fails the test."""

    def __init__(self, store, candidates: dict[str, bool], environments: dict[str, bool]):
        self.store, self.candidates, self.environments = store, candidates, environments
        self.jobs: list[str] = []
        self.conn = SimpleNamespace(stub=lambda name: SimpleNamespace(ValidateTrainingConfig=self.validate))

    def validate(self, request):
        from services.trainer.configs import validate_training_config

        values = validate_training_config(T.TrainingKind.Name(request.kind), MessageToDict(request.config.values),
                                          request.field_path).model_dump(mode="json")
        s = Struct()
        s.update(values)
        return T.ValidateTrainingConfigResponse(config=t.Config(values=s))

    def run(self, service, spec, run_id, description, **kw):
        assert service != "trainer", f"a training job was created: {description}"
        self.jobs.append(service)
        job = t.Job(job_id=f"{service}-{len(self.jobs)}")
        if service == "analysis":
            return A.GetAnalysisJobResponse(job=job, results=[A.CapabilityResult(
                capability=t.Capability(name=name), retained=kept, coverage_mean=0.3 if kept else 0.02,
                rejection_reason="" if kept else "coverage") for name, kept in self.candidates.items()])
        assert service == "environment", service
        records = []
        for cap, accepted in self.environments.items():   # 4 groups of 2 calibration episodes each
            uri = self.store.put_bytes(f"runs/{run_id}/environments/{cap}/validation.json",
                                       json.dumps(report([[0.0, 1.0]] * 4)).encode()).uri
            records.append(E.EnvironmentRecord(
                name=cap, version="1", capability=cap, validation_report=t.ArtifactRef(uri=uri),
                status=E.VALIDATION_STATUS_ACCEPTED if accepted else E.VALIDATION_STATUS_REJECTED,
                rejection_reasons=[] if accepted else ["calibration: mean reward 0.5 outside [0.2, 0.4]"]))
        return E.GetGenerationJobResponse(job=job, environments=records)


def run_config(on_no_capability: str = "baselines", **evaluation) -> RunConfig:
    return RunConfig(run_id="nocap", training={"grpo": GRPO}, analysis={"on_no_capability": on_no_capability},
                     evaluation={"limit": 20, "dev_limit": 8, "probe_limit": 4, "grpo_budgets": [0.5, 1, 2],
                                 "bootstrap_samples": 200, **evaluation})


def pipeline(tmp_path, candidates: dict[str, bool], environments: dict[str, bool] | None = None,
             on_no_capability: str = "baselines") -> Pipeline:
    """A pipeline whose rollout stage is done (6 base episodes), over the stand-in services."""
    store = open_store(tmp_path.as_uri())
    m = Manifest(run_id="nocap")
    rollout_stage_records(store, m, [trajectory(s, s % 2 == 0) for s in range(6)])
    m.stages["rollout"].status = "completed"
    services = Services(store, candidates, environments or {})
    return Pipeline(run_config(on_no_capability), runner=services, store=store, manifest=m)


def play(p: Pipeline, stages=TRACE_STAGES) -> None:
    """`stages` one after the other, each outcome recorded as `Pipeline.run` records it."""
    for stage in stages:
        outcome = StageOutcome.model_validate(getattr(p, f"stage_{stage}")())
        rec = p.manifest.stages[stage]
        rec.outputs, rec.jobs, rec.result, rec.status = outcome.outputs, outcome.jobs, outcome.result, "completed"
    p.manifest.save(p.store)


# How a run comes to have nothing to train: the candidates the analysis finds, the environments the
# environment service answers, and what the environments stage records.
NO_CAPABILITY = ({"coverage_gap": False, "tool_order": False}, {}, "the analysis retained no capability (of 2 "
                 "candidate(s))")
NONE_ACCEPTED = ({"coverage_gap": True}, {"coverage_gap": False}, "no environment was accepted (coverage_gap: "
                 "['calibration: mean reward 0.5 outside [0.2, 0.4]'])")


# -- "stop": the stage fails as it always did ----------------------------------------------------------
@pytest.mark.parametrize("candidates, environments, failing, message", [
    (NO_CAPABILITY[0], {}, "analysis", "analysis retained no capability: nothing to train"),
    (NONE_ACCEPTED[0], NONE_ACCEPTED[1], "environments", "no environment was accepted: coverage_gap"),
])
def test_stop_fails_the_stage_that_finds_nothing(tmp_path, candidates, environments, failing, message):
    p = pipeline(tmp_path, candidates, environments, on_no_capability="stop")
    play(p, TRACE_STAGES[:TRACE_STAGES.index(failing)])
    with pytest.raises(StageFailed, match=message):
        getattr(p, f"stage_{failing}")()


@pytest.mark.parametrize("on_no_capability", ["stop", "baselines"])
def test_a_run_that_finds_a_capability_is_the_same_either_way(tmp_path, on_no_capability):
    p = pipeline(tmp_path, {"coverage_gap": True, "tool_order": False}, on_no_capability=on_no_capability)
    play(p, ["analysis"])
    an = results_of(p.manifest).analysis
    assert ([c.name for c in an.capabilities], an.nothing_to_train) == (["coverage_gap"], None)


# -- "baselines": every TRACE stage completes empty, saying why ----------------------------------------
@pytest.mark.parametrize("case, jobs", [
    (NO_CAPABILITY, ["analysis"]),                    # no environment job: nothing to generate
    (NONE_ACCEPTED, ["analysis", "environment"]),     # the rejected candidate stays recorded
])
def test_baselines_completes_the_trace_stages_empty(tmp_path, capsys, case, jobs):
    candidates, environments, why = case
    p = pipeline(tmp_path, candidates, environments)
    capsys.readouterr()
    play(p)
    assert p.runner.jobs == jobs                      # no training job (Services fails the test on one)
    results = results_of(p.manifest)
    assert results.environments.nothing_to_train == why
    assert results.adapters.nothing_to_train == results.gates.nothing_to_train == why
    assert results.analysis.nothing_to_train == (why if not environments else None)
    assert [r.capability for r in results.environments.environments] == list(environments)
    assert results.environments.accepted == []
    for stage in ("environments", "adapters", "gates"):
        assert p.manifest.stages[stage].outputs == {}, stage
    assert p.manifest.stages["adapters"].jobs == p.manifest.stages["gates"].jobs == []
    lines = capsys.readouterr().err.splitlines()
    said = [line for line in lines if line.endswith(SUFFIX)]
    assert [line.split(":", 1)[0] for line in said] == [s for s in TRACE_STAGES if s != "analysis" or not environments]
    assert "the evaluation plays only the arms that need no adapter" in said[0]
    assert all(why in line for line in said[1:] if not line.startswith("analysis"))


# -- TRACE's budget: what it did play -------------------------------------------------------------------
@pytest.mark.parametrize("case, expected", [
    (NO_CAPABILITY, {"rollout": 6, "calibration": 0, "adapters": 0, "gates": 0, "total": 6}),
    (NONE_ACCEPTED, {"rollout": 6, "calibration": 8, "adapters": 0, "gates": 0, "total": 14}),   # the rejected one
])
def test_the_budget_counts_only_what_was_played(tmp_path, case, expected):
    p = pipeline(tmp_path, *case[:2])
    play(p)

    def ask():
        raise AssertionError("nothing to estimate: the trainer is not asked")
    b = trace_budget(p.store, p.manifest.stages, ask, ask)
    c = b.components
    assert {**{k: v.episodes for k, v in c.items()}, "total": b.total_episodes} == expected
    assert b.training_episodes == 0 and b.tokens_missing == ["calibration"]
    assert c["gates"].source == c["adapters"].source == f"no job: {case[2]}"


# -- the evaluation: only the arms that need no adapter ------------------------------------------------
@pytest.mark.parametrize("arms, played", [
    (["base", *ADAPTER_ARMS, "grpo_target"], ["base", "grpo_target"]),
    (["base", "trace_routing"], ["base"]),
    (["trace_soft", "best_single"], []),
])
def test_the_evaluation_plays_only_the_arms_without_adapters(tmp_path, arms, played):
    p = pipeline(tmp_path, *NO_CAPABILITY[:2])
    play(p)
    ev = FakeEvalPipeline(cfg=run_config(arms=arms), runner=None, store=p.store, manifest=p.manifest).setup()
    result = results_of(SimpleNamespace(stages={"evaluation": SimpleNamespace(result=evaluate(ev)["result"])}))
    ev_result = result.evaluation
    assert list(ev_result.arms) == played
    assert list(ev_result.arms_not_played) == [a for a in arms if a in ADAPTER_ARMS]
    assert all(why == f"needs TRACE's adapters, and none were trained: {NO_CAPABILITY[2]}"
               for why in ev_result.arms_not_played.values())
    assert (ev_result.paired, ev_result.power, ev_result.expert_usage) == (None, None, None)   # no trace_routing
    assert ev_result.trace_budget_episodes == 6
    assert not any("dev" in c or "composition" in c for c in ev.calls)
    if "grpo_target" in played:   # its curve at TRACE's budget as counted: 6 episodes, 8 per iteration
        assert [(pt.multiple, pt.iteration) for pt in ev_result.grpo_curve] == [(0.5, 1), (1.0, 1), (2.0, 2)]


# -- the report --------------------------------------------------------------------------------------
def test_the_report_names_every_arm_not_played(tmp_path):
    p = pipeline(tmp_path, *NONE_ACCEPTED[:2])
    play(p)
    arms = ["base", *ADAPTER_ARMS]
    ev = FakeEvalPipeline(cfg=run_config(arms=arms), runner=None, store=p.store, manifest=p.manifest).setup()
    p.manifest.stages["evaluation"].result = evaluate(ev)["result"]
    out = write_report(ev.cfg, p.manifest, p.store)
    md = p.store.get_bytes(p.store.key_of(out["outputs"]["markdown"])).decode()
    page = p.store.get_bytes(p.store.key_of(out["outputs"]["html"])).decode()
    why = NONE_ACCEPTED[2].replace("|", "\\|")
    for arm in ADAPTER_ARMS:
        assert f"| {arm} | not played: needs TRACE's adapters, and none were trained: {why} | | | | | |" in md
    assert "| base | " in md
    missing = out["result"]["missing_sections"]
    assert missing["paired_comparison"].startswith("trace_routing was not played: needs TRACE's adapters")
    assert missing["expert_usage"].startswith("trace_routing was not played")
    assert missing["training_curves"] == f"no adapter was trained: {NONE_ACCEPTED[2]}"
    assert f"Nothing trained: {NONE_ACCEPTED[2]} {SUFFIX}" in md
    assert "No row for the arms not played (best_single, trace_routing, trace_per_request, trace_soft)" in md
    assert "No routed example: trace_routing was not played" in page


# -- the field -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, analysis_hash_changes", [
    ("stop", False),        # the default: the hashes of runs recorded before the field existed
    ("baselines", True),    # what the analysis and every later stage produce changes: re-run from there
])
def test_the_field_is_part_of_the_analysis_hash_only_when_set(value, analysis_hash_changes):
    before = RunConfig(run_id="h")
    after = RunConfig(run_id="h", analysis={"on_no_capability": value})
    unset = before.analysis.model_dump(exclude={"on_no_capability"})
    assert before.section("analysis")["parts"] == [unset]   # the default hashes as a config without the field
    assert (config_hash(after.section("analysis")) != config_hash(before.section("analysis"))) is analysis_hash_changes
    assert config_hash(after.section("rollout")) == config_hash(before.section("rollout"))


def test_a_wrong_value_names_the_field(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run_id: x\nanalysis: {on_no_capability: baseline}\n")
    with pytest.raises(InvalidArgument, match=r"analysis\.on_no_capability.*'stop' or 'baselines'"):
        load_config(path)


# -- an analysis job whose analyst could not reply usably ----------------------------------------------
@pytest.mark.parametrize("on_no_capability, code, goes_on", [
    ("baselines", "FAILED_PRECONDITION", True),    # the analyst's replies were unusable: no capability
    ("baselines", "UNAVAILABLE", False),           # the endpoint is down: a failure, whatever the mode
    ("stop", "FAILED_PRECONDITION", False),
])
def test_an_analysis_whose_analyst_cannot_reply_is_no_capability_only_under_baselines(
        tmp_path, capsys, on_no_capability, code, goes_on):
    from tracectl.run.jobs import JobFailed

    p = pipeline(tmp_path, {}, on_no_capability=on_no_capability)
    message = f"analysis job analysis-1 FAILED: {code} the analyst model's reply was rejected 3 times"

    def failing(service, *a, **kw):
        raise JobFailed(message, job_id="analysis-1", code=code)
    p.runner.run = failing
    if not goes_on:
        with pytest.raises(JobFailed, match=code):
            p.stage_analysis()
        return
    play(p, ["analysis"])
    an = results_of(p.manifest).analysis
    assert an.capabilities == [] and an.nothing_to_train == f"the analyst produced no usable capability ({message})"
    assert p.manifest.stages["analysis"].jobs == ["analysis-1"]
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.endswith(SUFFIX)]
    assert line.startswith("analysis: the analyst produced no usable capability")
