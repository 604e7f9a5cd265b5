"""One analysis job from rollout artifacts to the written report (the job body).

    load trajectories -> candidates (discovery | diagnostics) -> N labeling runs
    -> per-run statistics -> K-of-N decisions (+ kappa) -> labels.jsonl, plots, report.md,
    report.json (last)

Both modes share everything after the labels. Documented job failures, besides those of
artifacts_io and the analyst (analyst.py):
  * FAILED_PRECONDITION "no failed trajectories" -- nothing to explain; a rollout with no
    failures cannot be analysed contrastively;
  * FAILED_PRECONDITION "no diagnostics" -- diagnostics mode on trajectories whose environment
    tagged no capability (use LLM mode).
A job that fails writes no report.json and publishes no result: partial runs are never
reported as complete.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from trace_common.artifacts import ArtifactInfo
from trace_common.endpoints import ResolvedEndpoint
from trace_common.errors import FailedPrecondition
from trace_common.jobs import JobContext, Output
from trace_common.llm import LlmConfig

from . import diagnostics_mode, plots
from .analyst import Analyst, AnalystConfig
from .artifacts_io import RolloutRef, open_root, output_prefix, read_rollouts, write_files
from .discovery import discover
from .labeling import LabelRun, llm_label_runs
from .metrics import CAPABILITIES, LABELS, M
from .prompts import default_prompts_dir, load_template
from .report import render_markdown
from .result import MODES, AnalysisResult, build_outcomes, unexplained_summary
from .settings import AnalysisSettings
from .specs import AnalysisSpecModel
from .stats import Thresholds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobConfig:
    """The spec with every default applied (zero in the spec = the documented default)."""

    mode: str                # "llm" | "diagnostics"
    thresholds: Thresholds
    max_candidates: int
    seed: int
    budget: int

    @classmethod
    def resolve(cls, spec: AnalysisSpecModel, settings: AnalysisSettings) -> JobConfig:
        runs = spec.num_runs or 10
        return cls(mode=MODES[spec.mode],
                   thresholds=Thresholds(min_coverage=spec.min_coverage or 0.10, min_gap=spec.min_gap or 0.20,
                                         min_passing_runs=spec.min_passing_runs or 8, num_runs=runs),
                   max_candidates=spec.max_candidates or 10, seed=spec.seed,
                   budget=spec.trajectory_char_budget or settings.trajectory_char_budget)


def analyst_config(spec: AnalysisSpecModel, settings: AnalysisSettings, endpoint: ResolvedEndpoint) -> AnalystConfig:
    """The analyst of an LLM-mode spec; `endpoint` is `spec.llm` as the service's endpoint profiles
    resolved it (Analyses.create_job does that, before a job exists)."""
    assert spec.llm is not None  # the spec validator requires it in LLM mode
    return AnalystConfig(
        llm=LlmConfig.of(endpoint, timeout_seconds=spec.llm.timeout_seconds or settings.llm_timeout_seconds,
                         max_retries=settings.llm_max_retries),
        max_concurrency=spec.llm.max_concurrency or settings.llm_max_concurrency,
        max_attempts=settings.llm_max_attempts, temperature=settings.llm_temperature,
        max_tokens=settings.llm_max_tokens, response_format=settings.llm_response_format)


def labels_jsonl(trajectories, runs: list[LabelRun]) -> bytes:
    """One line per (run, drawn trajectory): every label and its evidence, and how many times
    the run drew the trajectory (bootstrap multiplicity)."""
    lines = []
    for run in runs:
        counts: dict[int, int] = {}
        for i in run.draws:
            counts[i] = counts.get(i, 0) + 1
        for i in sorted(counts):
            t = trajectories[i]
            lines.append(json.dumps({
                "run": run.index, "run_seed": run.seed, "index": i, "task_id": t.task_id,
                "sample_index": t.sample_index, "success": t.success, "multiplicity": counts[i],
                "labels": {c: {"label": pl.label.value, "evidence": pl.evidence} for c, pl in run.labels[i].items()},
            }, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode("utf-8")


async def run_analysis(ctx: JobContext, spec: AnalysisSpecModel, settings: AnalysisSettings,
                       analyst: Analyst | AnalystConfig | None = None, *,
                       rollouts: list[RolloutRef]) -> AnalysisResult:
    """The job body. LLM mode needs `analyst`: an Analyst, or the config to make one (closed at the end).
    `rollouts`: spec.rollout_uris as artifacts_io.confine_rollouts admitted them (only these are read)."""
    cfg = JobConfig.resolve(spec, settings)
    th = cfg.thresholds
    s3 = settings.s3_settings()
    observer = M.artifact_observer
    ctx.progress(stage="loading", message=f"reading {len(rollouts)} rollout artifact(s)")
    trajectories, sources = await asyncio.to_thread(read_rollouts, rollouts, settings.max_rollout_bytes)
    n_failed = sum(not t.success for t in trajectories)
    n_passed = len(trajectories) - n_failed
    if n_failed == 0:
        raise FailedPrecondition(f"no failed trajectories among the {len(trajectories)} in {spec.rollout_uris}: "
                                 "contrastive analysis explains failures, and this rollout has none (every "
                                 "episode passed); analyse a harder split or a weaker policy")
    warnings: list[str] = []
    if n_passed == 0:
        warnings.append("no passed trajectories: ER+ is 0 in every run, so Delta equals ER- and does not "
                        "contrast failures with successes")
    analyst_info: dict = {}
    if cfg.mode == "diagnostics":
        if not diagnostics_mode.has_diagnostics(trajectories):
            raise FailedPrecondition("diagnostics mode needs environment diagnostics, but no trajectory carries a "
                                     "capability-tagged diagnostic or task capability metadata; use "
                                     "ANALYST_MODE_LLM")
        candidates = diagnostics_mode.candidates(trajectories, cfg.max_candidates)
        ctx.progress(stage="labeling", completed=0, total=th.num_runs,
                     message=f"{len(candidates)} capabilities from diagnostics, {th.num_runs} bootstrap runs")
        runs = diagnostics_mode.bootstrap_runs(trajectories, [c.name for c in candidates],
                                               num_runs=th.num_runs, seed=cfg.seed)
        ctx.progress(completed=th.num_runs)
    else:
        prompts_dir = Path(settings.prompts_dir or default_prompts_dir())
        discover_tpl, label_tpl = load_template(prompts_dir, "discover"), load_template(prompts_dir, "label")
        if analyst is None:
            raise FailedPrecondition("LLM mode needs the analyst's endpoint (services/analysis/service.py resolves "
                                     "spec.llm against TRACE_ANALYSIS_ENDPOINTS)")
        own = isinstance(analyst, AnalystConfig)
        analyst = Analyst(analyst) if isinstance(analyst, AnalystConfig) else analyst
        analyst_info = {"base_url": analyst.config.llm.base_url, "model": analyst.config.llm.model,
                        "temperature": analyst.config.temperature,
                        "max_concurrency": analyst.config.max_concurrency, "prompts_dir": str(prompts_dir)}
        try:
            ctx.progress(stage="discovery", message="proposing candidate capabilities")
            disc = await discover(analyst, discover_tpl, trajectories, max_candidates=cfg.max_candidates,
                                  per_budget=cfg.budget, total_budget=settings.discovery_char_budget,
                                  max_failed=settings.discovery_max_failed,
                                  max_passed=settings.discovery_max_passed, seed=cfg.seed)
            candidates = disc.candidates
            warnings += disc.warnings
            analyst_info["discovery_shown_task_ids"] = disc.shown_task_ids
            total = th.num_runs * len(trajectories) * len(candidates)
            done = 0
            ctx.progress(stage="labeling", completed=0, total=total,
                         message=f"{len(candidates)} candidates x {len(trajectories)} trajectories x "
                                 f"{th.num_runs} runs")

            def pair_done(n: int) -> None:
                nonlocal done
                done += n
                ctx.progress(completed=done)

            runs = await llm_label_runs(analyst, label_tpl, trajectories, candidates, num_runs=th.num_runs,
                                        seed=cfg.seed, budget=cfg.budget, on_pair_done=pair_done)
            analyst_info["requests"] = analyst.requests
        finally:
            if own:
                await analyst.close()

    for run in runs:
        for i in run.draws:
            for pl in run.labels[i].values():
                LABELS.labels(pl.label.value, cfg.mode).inc()
    ctx.progress(stage="statistics", message="contrastive statistics")
    outcomes = build_outcomes(trajectories, candidates, runs, th, with_kappa=cfg.mode == "llm")
    rec = ctx.record
    result = AnalysisResult(
        job_id=rec.job_id, run_id=rec.run_id, mode=cfg.mode, thresholds=th, seed=cfg.seed,
        inputs={"rollout_uris": [s.uri for s in sources], "rollout_sha256": [s.sha256 for s in sources],
                "n_trajectories": len(trajectories), "n_failed": n_failed, "n_passed": n_passed,
                "trajectory_char_budget": cfg.budget},
        capabilities=outcomes, warnings=warnings, analyst=analyst_info,
        unexplained=unexplained_summary(trajectories, runs, outcomes))
    ctx.progress(stage="report", message="writing report")
    written = await asyncio.to_thread(_write_report, result, trajectories, runs, settings, s3, observer)
    for name, info in written:  # on the loop thread: JobContext is not thread-safe
        ctx.add_output(Output(uri=info.uri, sha256=info.sha256, size_bytes=info.size,
                              kind=_KINDS.get(name, "analysis-plot")))
    for o in outcomes:
        CAPABILITIES.labels("retained" if o.decision.retained else "rejected").inc()
    ctx.set_metrics({"trajectories": len(trajectories), "failed_trajectories": n_failed,
                     "candidates": len(outcomes), "retained_capabilities": len(result.retained)})
    ctx.progress(stage="done", message=f"{len(result.retained)} of {len(outcomes)} capabilities retained "
                                       f"({cfg.mode} mode)")
    return result


_KINDS = {"labels.jsonl": "analysis-labels", "report.md": "analysis-report-markdown", "report.json": "analysis-report"}


def _write_report(result: AnalysisResult, trajectories, runs, settings: AnalysisSettings, s3,
                  observer) -> list[tuple[str, ArtifactInfo]]:
    """Labels, plots, report.md, then report.json (which lists the others' URIs) last."""
    store = open_root(settings.artifact_root, s3, observer)
    prefix = output_prefix(result.run_id, result.job_id)
    report = result.to_dict()
    images = plots.render_all(report) if settings.plots else {}
    files = [("labels.jsonl", labels_jsonl(trajectories, runs)), *images.items(),
             ("report.md", render_markdown(report, list(images)).encode("utf-8"))]
    infos = write_files(store, prefix, files)
    result.outputs = {name: info.uri for (name, _), info in zip(files, infos, strict=True)}
    result.outputs["report.json"] = store.uri_for(f"{prefix}/report.json")
    (info_json,) = write_files(store, prefix, [("report.json", json.dumps(result.to_dict(), indent=2).encode())])
    return [*((name, info) for (name, _), info in zip(files, infos, strict=True)), ("report.json", info_json)]
