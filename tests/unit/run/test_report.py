"""The run report renders from a manifest into markdown and a self-contained HTML page that a
real browser (Debian's chromium through Playwright) displays: every plot decodes, the routed
example colours tokens by expert, and sections without data say so instead of vanishing."""

from __future__ import annotations

import json
import shutil

import pytest

from trace_common.artifacts import open_store
from tracectl.run.config import RunConfig
from tracectl.run.manifest import Manifest
from tracectl.run.report import SECTIONS, TABLES, write_report
from tracectl.run.results import ArmResult, CurvePoint, ExpertUsage, RoutedExample, RoutedToken

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _arm(rate: float, n: int = 40, spent: int = 0) -> dict:
    return {"pass_rate": rate, "ci": [max(0.0, rate - 0.1), min(1.0, rate + 0.1)], "episodes": n,
            "training_rollouts": spent, "wall_seconds": 12.0,
            "breakdown": {"precondition_check": {"n": n // 2, "pass_rate": rate, "ci": [0, 1]},
                          "record_selection": {"n": n // 2, "pass_rate": rate / 2, "ci": [0, 1]}}}


def _store_episodes(store, name: str, skills: dict[str, float], seeds=range(500_000, 500_012)) -> str:
    """An arm's test trajectories: the store's scripted expert with `skills`, stored as an arm stores them."""
    from trace_common.domains.store import DEFAULT_SKILLS, ExpertConfig, StoreEnv, StoreExpert
    from trace_common.env import dumps_jsonl

    expert = StoreExpert(ExpertConfig(skills={**dict.fromkeys(DEFAULT_SKILLS, 1.0), **skills}))
    trajs = [expert.play(StoreEnv(), s) for s in seeds]
    return store.put_bytes(f"runs/rep/evaluation/{name}.jsonl", dumps_jsonl(trajs)).uri


def _manifest(store, *, with_routing: bool) -> tuple[RunConfig, Manifest]:
    cfg = RunConfig(run_id="rep")
    m = Manifest(run_id="rep")
    curve = store.put_bytes("runs/rep/adapters/precondition_verification/v1/metrics.jsonl",
                            "".join(json.dumps({"iteration": i, "reward_mean": 0.1 * i}) + "\n"
                                    for i in range(1, 6)).encode())
    m.stages["analysis"].result = {"mode": "diagnostics", "candidates": [
        {"capability": {"name": "precondition_verification"}, "retained": True, "coverage_mean": 0.4,
         "gap_mean": 0.5, "passing_runs": 10},
        {"capability": {"name": "tool_call_precision"}, "retained": False, "coverage_mean": 0.05,
         "gap_mean": 0.1, "passing_runs": 2, "rejection_reason": "coverage below rho"}]}
    m.stages["adapters"].result = {"curves": {"precondition_verification": curve.uri}}
    ev = {"arms": {"base": _arm(0.3), "trace_routing": _arm(0.45, spent=640)}}
    if with_routing:   # (this manifest's arms also name their test trajectories)
        ev["arms"]["base"]["uri"] = _store_episodes(store, "base", {"tool_call_precision": 0.0})
        ev["arms"]["trace_routing"]["uri"] = _store_episodes(store, "trace_routing", {})
        ev["expert_usage"] = {"experts": ["base", "precondition_verification"],
                              "rows": {"precondition_check": [[3, 1], [1, 3]], "record_selection": [[4, 0], [2, 2]]}}
        ev["routed_example"] = {"experts": ["base", "precondition_verification"], "tokens": [
            {"text": "<tool_call>", "expert_index": 0, "expert": "base"},
            {"text": "get_order_details", "expert_index": 1, "expert": "precondition_verification"}]}
    m.stages["evaluation"].result = ev
    return cfg, m


#: What a manifest from before the paired statistics, budget curve and probes lacks (its arms name
#: no trajectories, so no sub-goal success either).
OLD_EVALUATION = {"paired_comparison", "grpo_budget_curve", "budget", "per_probe", "subgoal_success",
                  "per_capability_subgoals"}


@pytest.mark.parametrize("with_routing, missing", [
    (True, OLD_EVALUATION - {"subgoal_success", "per_capability_subgoals"}),
    (False, {"expert_usage"} | OLD_EVALUATION),
])
def test_report_sections_and_missing_data(tmp_path, with_routing, missing):
    store = open_store(tmp_path.as_uri())
    cfg, m = _manifest(store, with_routing=with_routing)
    out = write_report(cfg, m, store)
    assert set(out["result"]["missing_sections"]) == missing
    md = store.get_bytes("runs/rep/report/report.md").decode()
    assert "| trace_routing | 0.450 |" in md and "| tool_call_precision | no |" in md
    for name in (*SECTIONS, *TABLES):
        assert (f"- {name}: not available" in md) is (name in missing), name
    assert set(out["outputs"]) >= {"markdown", "html", "pass_rate_per_arm", "training_curves"}


def test_report_of_a_full_evaluation(tmp_path, monkeypatch):
    """Every evaluation section renders from what the evaluation stage records (stand-in services),
    and the report's own stage shows as this report while it is being written, not as running."""
    from tests.unit.evaluation import test_stage as te

    monkeypatch.setattr(te.routing, "routing_usage", lambda *a, **kw: (
        ExpertUsage(experts=["base", "x"], rows={"precondition_check": [[2, 1]]}, episodes=1),
        RoutedExample(experts=["base", "x"], tokens=[RoutedToken(text="hi", expert_index=1, expert="x")])))
    p = te.pipeline(tmp_path).setup()
    p.manifest.stages["evaluation"].result = te.evaluate(p)["result"]
    p.manifest.stages["report"].status = "running"
    out = write_report(p.cfg, p.manifest, p.store)
    md = p.store.get_bytes("runs/ev/report/report.md").decode()
    # (this manifest has no analysis candidates or adapter curves: those two plots are the only gaps)
    assert set(out["result"]["missing_sections"]) == {"candidates", "training_curves"}
    assert md.count("not available") == 2
    ev = p.manifest.stages["evaluation"].result
    for name, c in ev["paired"]["vs"].items():   # one row per compared arm, its McNemar p and interval
        assert f"| {name} | 40 | {c['pass_rate_x']:.3f} | {c['pass_rate_y']:.3f} | {c['diff']:+.3f} |" in md
        assert f"| {c['only_x']} | {c['only_y']} | {c['p_value']:.3g} |" in md
    assert "Power: with 40 paired tasks" in md and "resolvable at this test size" in md
    for pt in ev["grpo_curve"]:
        assert f"| {pt['multiple']:g}x | {pt['iteration']} | {pt['training_episodes']:,} |" in md
    # a point that ties TRACE routing reads +0.000, never -0.000
    ev["paired"]["vs"][ev["grpo_curve"][0]["name"]]["diff"] = 0.0
    write_report(p.cfg, p.manifest, p.store)
    assert "-0.000" not in p.store.get_bytes("runs/ev/report/report.md").decode()
    assert "| **total** | **124** |" in md and "| &nbsp;&nbsp;warm start (slot replays) | 6 |" in md
    for header in ("## Per probe", "## Per required capability", "## Budget: every episode TRACE played",
                   "## GRPO on the target at several budgets", "## Paired comparison"):
        assert header in md
    assert "| report | this report |" in md and "| report | running |" not in md


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/install_tools.sh installs it)")
@pytest.mark.parametrize("with_routing", [True, False])
def test_html_report_renders_in_chromium(tmp_path, with_routing):
    from playwright.sync_api import sync_playwright

    store = open_store(tmp_path.as_uri())
    cfg, m = _manifest(store, with_routing=with_routing)
    write_report(cfg, m, store)
    page_path = tmp_path / "runs/rep/report/report.html"
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page()
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("requestfailed", lambda req: errors.append(req.url))
            page.goto(page_path.as_uri(), wait_until="load")
            sizes = page.evaluate("[...document.images].map(i => [i.alt, i.complete, i.naturalWidth])")
            spans = page.evaluate("[...document.querySelectorAll('pre.routed span')].map(s => s.title)")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert not errors                           # self-contained: nothing fetched, no script errors
    expected = {"pass_rate_per_arm", "candidates", "training_curves", "sample_efficiency"}
    if with_routing:
        expected.add("subgoal_success")
        expected.add("expert_usage")
    assert {alt for alt, _, _ in sizes} == expected
    assert all(done and width > 100 for _, done, width in sizes)   # every plot decoded
    assert spans == (["base", "precondition_verification"] if with_routing else [])


@pytest.mark.parametrize(("rows", "below", "above"), [
    ([{"pass_rate": 0.0, "ci": [1.4e-17, 0.138]}], [0.0], [0.138]),       # a stored bound 1e-17 above 0 successes
    ([{"pass_rate": 1.0, "ci": [0.862, 1.0 + 1e-16]}], [pytest.approx(0.138)], [0.0]),
    ([{"pass_rate": 0.5, "ci": [0.3, 0.7]}, {"pass_rate": 0.0, "ci": [0.0, 0.2]}],
     [pytest.approx(0.2), 0.0], [pytest.approx(0.2), 0.2]),
])
def test_error_bars_are_never_negative(rows, below, above):
    from tracectl.run.report import ci_errors

    assert ci_errors([ArmResult.model_validate(r) for r in rows]) == [below, above]


def test_arms_that_pass_nothing_plot():
    from trace_common.stats import wilson_interval
    from tracectl.run.report import plot_arms

    arms = {name: ArmResult(pass_rate=0.0, ci=list(wilson_interval(0, 24))) for name in ("base", "trace_routing")}
    assert plot_arms(arms)[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("rows", "top"), [
    ([{"pass_rate": 0.122, "ci": [0.096, 0.154]}, {"pass_rate": 0.04, "ci": [0.026, 0.061]}], 0.2),  # 0.154 * 1.25
    ([{"pass_rate": 0.5, "ci": [0.4, 0.6]}], 0.75),
    ([{"pass_rate": 0.9, "ci": [0.85, 0.95]}], 1.0),                     # never above 1
    ([{"pass_rate": 0.0, "ci": [0.0, 0.0]}], 0.05),                       # nothing passed: still an axis
    ([{"pass_rate": 0.2}], 0.25),                                         # no interval stored: the rate
    ([{"name": "no rate"}], 1.0),                                         # nothing to scale by (skipped)
])
def test_the_sample_efficiency_axis_fits_what_it_shows(rows, top):
    from tracectl.run.report import sample_efficiency_top

    points = [CurvePoint.model_validate({"multiple": 1.0, "iteration": 1, "name": "p", **r}) for r in rows]
    assert sample_efficiency_top(points) == pytest.approx(top)


@pytest.mark.parametrize(("arms", "why"), [
    ({"base": {}}, "no arm records its test trajectories"),
    ({"base": {"uri": "tau2"}}, "the target's verifier attributes no sub-goals (only the built-in store's does)"),
])
def test_subgoal_success_says_why_it_is_missing(tmp_path, arms, why):
    from trace_common.env import dumps_jsonl, loads_jsonl
    from tracectl.run.report import subgoals_by_arm

    store = open_store(tmp_path.as_uri())
    for a in arms.values():
        if a.get("uri") == "tau2":   # another target's episodes
            trs = loads_jsonl(store.get_bytes(store.key_of(_store_episodes(store, "store", {}))))
            other = [tr.model_copy(update={"env": tr.env.model_copy(update={"name": "tau2-retail"})}) for tr in trs]
            a["uri"] = store.put_bytes("x/traj.jsonl", dumps_jsonl(other)).uri
    assert subgoals_by_arm(store, {n: ArmResult.model_validate(a) for n, a in arms.items()}) == ({}, why)


@pytest.mark.parametrize(("skills", "short"), [
    ({}, set()),
    ({"tool_call_precision": 0.0}, {"tool_call_precision"}),
    ({"precondition_verification": 0.0}, {"precondition_verification"}),
])
def test_subgoal_success_per_arm_locates_the_missing_skill(tmp_path, skills, short):
    """The table and plot read each arm's own test episodes: a missing skill is the one below 1."""
    from tracectl.run.report import plot_subgoals, subgoal_lines, subgoals_by_arm

    store = open_store(tmp_path.as_uri())
    arms = {"base": ArmResult(uri=_store_episodes(store, "base", skills))}
    subgoals, why = subgoals_by_arm(store, arms)
    assert why is None
    rates = subgoals["base"]
    assert {c for c, r in rates.items() if r.rate < 1.0} == short
    assert all(r.total > 0 and 0 <= r.met <= r.total for r in rates.values())
    md = "\n".join(subgoal_lines(subgoals, {}, ""))
    for c, r in rates.items():
        assert f"{r.met} / {r.total} ({r.rate:.2f})" in md and c in md
    assert plot_subgoals(subgoals)[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("task_types", [1, 3])
def test_expert_usage_plot_is_page_wide_and_legible(task_types):
    """One full-width panel per task type (labels at 8 pt and up), whatever the number of slots."""
    import io

    from PIL import Image

    from tracectl.run.report import plot_expert_usage

    experts = ["base", "multi_step_task_completion", "precondition_verification", "tool_call_precision"]
    rows = {f"type{i}": [[i + 1, 2, 3, 4] for _ in range(8)] for i in range(task_types)}
    w, h = Image.open(io.BytesIO(plot_expert_usage(ExpertUsage(experts=experts, rows=rows)))).size
    assert w >= 700 and h >= 200 * task_types   # shown at up to 1,020 px: the page width


@pytest.mark.parametrize(("adapters", "gates", "expected"), [
    ({"precondition_verification": "file:///s/runs/rep/adapters/precondition_verification/tensorboard/ev.1"},
     "file:///s/runs/rep/moe/rep-moe/tensorboard/ev.2",
     ["- adapter precondition_verification: `file:///s/runs/rep/adapters/precondition_verification/tensorboard/`",
      "- gates: `file:///s/runs/rep/moe/rep-moe/tensorboard/`"]),
    ({}, None, []),                                           # a run whose jobs wrote no event files
])
def test_report_links_each_jobs_tensorboard_logdir(tmp_path, adapters, gates, expected):
    store = open_store(tmp_path.as_uri())
    cfg, m = _manifest(store, with_routing=False)
    m.stages["adapters"].result["tensorboard"] = adapters
    if gates:
        m.stages["gates"].outputs["tensorboard"] = gates
    write_report(cfg, m, store)
    md = store.get_bytes("runs/rep/report/report.md").decode()
    assert [line for line in md.splitlines() if line.startswith("- adapter ") or line.startswith("- gates:")] == expected
    assert ("## Training curves in TensorBoard" in md) is bool(expected)
