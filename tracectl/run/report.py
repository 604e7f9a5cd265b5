"""The run report: markdown plus a self-contained HTML page (plots embedded as PNG data URIs).

Every number comes from the manifest (which points at the jobs and artifacts that made it).
Sections whose inputs a run does not have say so explicitly instead of disappearing.

Evaluation sections (tracectl/evaluation/stage.py produces their data): pass rate per arm with
each method's budget; the paired comparison of TRACE routing with every other arm (exact McNemar,
paired bootstrap interval) and the smallest difference the test size resolves; GRPO on the target
at several budgets and the sample-efficiency plot (pass rate vs training episodes: the GRPO
curve from its checkpoints, TRACE at its budget, the base at 0); the budget table (every episode
TRACE played, per component, tokens beside); the per-probe and per-required-capability pass
rates. The stage table shows the report's own stage as "this report" while it is being written.
A run that trained nothing (analysis.on_no_capability "baselines") lists every arm it did not play
with the reason, and says why the parts that need TRACE's arms (paired comparison, expert usage,
training curves) are absent.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from trace_common.artifacts import ArtifactStore  # noqa: E402
from trace_common.stats import mcnemar_min_detectable  # noqa: E402
from tracectl.evaluation.scoring import subgoal_success  # noqa: E402
from tracectl.run.config import RunConfig  # noqa: E402
from tracectl.run.manifest import Manifest  # noqa: E402
from tracectl.run.results import (  # noqa: E402
    ArmResult,
    Candidate,
    CurvePoint,
    EvaluationResult,
    ExpertUsage,
    Power,
    Rate,
    ReportResult,
    RoutedExample,
    SubgoalRate,
    dump,
    results_of,
)

SECTIONS = ("pass_rate_per_arm", "subgoal_success", "candidates", "training_curves", "sample_efficiency",
            "expert_usage", "routed_example")
#: Table sections of the evaluation (each says "not available" when the run has no data for it).
TABLES = ("paired_comparison", "grpo_budget_curve", "budget", "per_probe", "per_capability", "per_capability_subgoals")
#: The difference the paper reports (docs/design.md "Evaluation": the test size must resolve it).
PAPER_DIFFERENCE = 0.08
TRACE_ARMS = ("trace_routing", "trace_per_request", "trace_soft")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


#: Plots shown at the page's width in the HTML report (their labels are unreadable at half of it).
WIDE_PLOTS = ("expert_usage", "subgoal_success")
#: One colour per arm across the plots.
ARM_COLOURS = {"base": "#888", "trace_routing": "#2a9d4b", "trace_per_request": "#3b7dd8", "trace_soft": "#8e44ad",
               "grpo_target": "#c0392b", "best_single": "#e67e22", "gepa": "#16a085"}


def plot_arms(arms: dict[str, ArmResult]) -> bytes | None:
    if not arms:
        return None
    names = list(arms)
    rates = [arms[n].pass_rate for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(names, rates, yerr=ci_errors([arms[n] for n in names]), capsize=5, color=["#888" if n == "base" else "#3b7dd8" for n in names])
    ax.set_ylabel("held-out pass rate (95% CI)")
    ax.set_ylim(0, 1)
    ax.set_title("Pass rate per arm")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    return _png(fig)


def subgoals_by_arm(store: ArtifactStore, arms: dict[str, ArmResult]) -> tuple[dict[str, dict[str, SubgoalRate]],
                                                                                str | None]:
    """{arm: {capability: SubgoalRate}} over each arm's compound test episodes, or ({}, why) when no
    arm has them (the reason the report prints)."""
    out, why = {}, "no arm records its test trajectories"
    for name, a in arms.items():
        if not a.uri:
            continue
        rates = subgoal_success(store, a.uri)
        if rates is None:
            why = "the target's verifier attributes no sub-goals (only the built-in store's does)"
            continue
        out[name] = rates
    return out, (None if out else why)


def plot_subgoals(subgoals: dict[str, dict[str, SubgoalRate]]) -> bytes | None:
    """Grouped bars: per capability, each arm's sub-goal success (share of the sub-requests needing
    it that did not fail on it), with the count of sub-requests under each capability."""
    if not subgoals:
        return None
    caps = sorted({c for r in subgoals.values() for c in r})
    names = list(subgoals)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(caps))]
        ys = [(r.rate or 0.0) if (r := subgoals[name].get(c)) else 0.0 for c in caps]
        ax.bar(xs, ys, width * 0.95, label=name, color=ARM_COLOURS.get(name, "#555"))
    totals = {c: max((r.total if (r := subgoals[n].get(c)) else 0) for n in names) for c in caps}
    ax.set_xticks(range(len(caps)), [f"{c.replace('_', ' ')}\n({totals[c]} sub-requests)" for c in caps], fontsize=8)
    ax.set_ylabel("sub-goal success", fontsize=9)
    ax.set_ylim(0, 1)
    ax.set_title("Per-capability sub-goal success on the compound test tasks", fontsize=10)
    ax.legend(fontsize=8, ncol=min(4, len(names)), loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    return _png(fig)


def plot_candidates(cands: list[Candidate], rho: float, delta: float) -> bytes | None:
    if not cands:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for c in cands:
        x, y = c.coverage_mean, c.gap_mean
        ax.scatter([x], [y], color="#2a9d4b" if c.retained else "#c0392b", s=40)
        ax.annotate(c.capability.name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axvline(rho, ls="--", color="#555")
    ax.axhline(delta, ls="--", color="#555")
    ax.set_xlabel("coverage (mean over runs)")
    ax.set_ylabel("contrastive gap Δ (mean over runs)")
    ax.set_title("Candidate capabilities (green: retained)")
    return _png(fig)


def _curve(store: ArtifactStore, uri: str) -> list[dict[str, float]]:
    """A training job's per-iteration metrics (JSON lines, or a JSON list / {"iterations": [...]})."""
    text = store.get_bytes(store.key_of(uri)).decode()
    if uri.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    return data.get("iterations", data) if isinstance(data, dict) else data


def plot_curves(curves: dict[str, list[dict[str, float]]], x: str, y: str, title: str) -> bytes | None:
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, pts in curves.items():
        xs = [p.get(x, i) for i, p in enumerate(pts)]
        ax.plot(xs, [p.get(y, 0.0) for p in pts], label=name, lw=1.4)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _png(fig)


def ci_errors(rows: list[ArmResult | CurvePoint]) -> list[list[float]]:
    """matplotlib's yerr ([below], [above]) for rows with `pass_rate` and `ci`, never negative
    (matplotlib refuses a negative error; a stored interval may come from an older run whose Wilson
    bound at 0 successes was 1e-17 above the rate)."""
    return [[max(0.0, r.pass_rate - r.ci[0]) for r in rows], [max(0.0, r.ci[1] - r.pass_rate) for r in rows]]


def _err(a: ArmResult) -> list[list[float]]:
    return ci_errors([a])


def sample_efficiency_top(rows: list[ArmResult | CurvePoint]) -> float:
    """The y-axis top of the sample-efficiency plot: the highest upper 95 % bound shown, plus a
    quarter, rounded up to 0.05 and at most 1 -- pass rates of a few percent on a 0-1 axis look
    alike, and the differences are what the plot is for."""
    tops = [(r.ci or [0.0, r.pass_rate])[1] for r in rows if r.pass_rate is not None]
    return min(1.0, max(0.05, math.ceil(max(tops, default=1.0) * 1.25 / 0.05 - 1e-9) * 0.05))


def plot_sample_efficiency(arms: dict[str, ArmResult], curve: list[CurvePoint] | None = None,
                           budget: int | None = None) -> bytes | None:
    """Held-out pass rate (95 % CI) vs training episodes: the GRPO-on-target curve (one run, its
    checkpoints), each TRACE arm at TRACE's budget, the other arms at theirs (the base at 0)."""
    points = [pt for pt in curve or [] if pt.pass_rate is not None]
    if not arms and not points:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if points:
        xs = [pt.training_episodes for pt in points]
        ax.errorbar(xs, [pt.pass_rate for pt in points],
                    yerr=ci_errors(points),
                    fmt="-o", capsize=4, color="#c0392b", label="GRPO on the target (checkpoints)")
        for pt, x in zip(points, xs, strict=True):
            ax.annotate(f"{pt.multiple:g}x", (x, pt.pass_rate), fontsize=7, xytext=(4, -10),
                        textcoords="offset points")
    markers = {"trace_routing": ("*", "#2a9d4b", 14), "trace_per_request": ("D", "#3b7dd8", 7),
               "trace_soft": ("s", "#8e44ad", 7), "base": ("o", "#888", 7), "best_single": ("^", "#e67e22", 8),
               "gepa": ("v", "#16a085", 8)}
    for name, a in arms.items():
        if name == "grpo_target" and points:
            continue   # it is the curve's 1x point
        marker, colour, size = markers.get(name, ("o", "#555", 6))
        ax.errorbar([a.training_episodes], [a.pass_rate], yerr=_err(a), fmt=marker, ms=size,
                    capsize=4, color=colour, label=name)
    if budget:
        ax.axvline(budget, ls=":", color="#2a9d4b", lw=1)
    ax.set_xlabel("training episodes (every episode the method played)")
    ax.set_ylabel("held-out pass rate (95% CI)")
    ax.set_ylim(0, sample_efficiency_top([*points, *arms.values()]))
    ax.set_title("Sample efficiency: pass rate vs episodes")
    ax.legend(fontsize=7)
    return _png(fig)


def plot_expert_usage(usage: ExpertUsage | None) -> bytes | None:
    """usage.rows: {task_type: [[count per expert] per position bucket]}.

    One panel per task type, full width, stacked bars: per position bucket of the generated reply,
    the share of (layer, token) routing decisions each slot got; the legend names every slot once,
    in words (the labels are meant to be read at the report page's width)."""
    rows = usage.rows if usage else None
    if not rows:
        return None
    import numpy as np

    experts = usage.experts
    palette = ["#bbb", "#3b7dd8", "#e67e22", "#2a9d4b", "#c0392b", "#8e44ad", "#16a085", "#f1c40f"]
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 0.6 + 2.0 * len(rows)), squeeze=False, sharex=True)
    for ax, (task, grid) in zip(axes[:, 0], sorted(rows.items()), strict=True):
        arr = np.asarray(grid, dtype=float)                     # [bucket, expert]
        arr = arr / np.maximum(arr.sum(axis=1, keepdims=True), 1)
        xs = np.arange(1, arr.shape[0] + 1)
        bottom = np.zeros(arr.shape[0])
        for e, name in enumerate(experts):
            ax.bar(xs, arr[:, e], bottom=bottom, color=palette[e % len(palette)], label=name.replace("_", " "))
            bottom += arr[:, e]
        ax.set_ylim(0, 1)
        ax.set_ylabel("share", fontsize=9)
        ax.set_title(f"{task} tasks", fontsize=9, loc="left")
        ax.tick_params(labelsize=8)
    axes[-1, 0].set_xlabel("position in the generated reply (equal buckets, first to last; empty: the replies "
                           "had ended)", fontsize=9)
    axes[-1, 0].set_xticks(xs)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    top = 1 - (0.35 + 0.25 * -(-len(experts) // 3)) / fig.get_figheight()   # room for the title and legend rows
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.legend(handles, labels, fontsize=9, ncol=min(3, len(experts)), loc="upper center", bbox_to_anchor=(0.5, 1.0),
               frameon=False, title="Which slot the gates route tokens to (share of layer x token decisions)",
               title_fontsize=10)
    return _png(fig)


def routed_example_html(example: RoutedExample | None) -> str | None:
    toks = example.tokens if example else None
    if not toks:
        return None
    palette = ["#ddd", "#8ecae6", "#ffb703", "#90be6d", "#f28482", "#cdb4db", "#b5e48c", "#f4a261", "#a8dadc"]
    spans = [f'<span title="{html.escape(e)}" style="background:{palette[i % len(palette)]}">{html.escape(tok)}</span>'
             for tok, i, e in ((t.text, t.expert_index, t.expert) for t in toks)]
    legend = " ".join(f'<span style="background:{palette[i % len(palette)]}">{html.escape(n)}</span>'
                      for i, n in enumerate(example.experts))
    return f"<p>{legend}</p><pre class='routed'>{''.join(spans)}</pre>"


def write_report(cfg: RunConfig, m: Manifest, store: ArtifactStore) -> dict[str, Any]:
    results = results_of(m)
    ev = results.evaluation
    arms = ev.arms
    an = results.analysis
    curves: dict[str, list[dict[str, float]]] = {}
    for cap, uri in results.adapters.curves.items():
        curves[cap] = _curve(store, uri)
    subgoals, no_subgoals = subgoals_by_arm(store, arms)
    plots = {
        "pass_rate_per_arm": plot_arms(arms),
        "subgoal_success": plot_subgoals(subgoals),
        "candidates": plot_candidates(an.candidates, cfg.analysis.min_coverage, cfg.analysis.min_gap),
        "training_curves": plot_curves(curves, "iteration", "reward_mean", "Training reward per adapter"),
        "sample_efficiency": plot_sample_efficiency(arms, ev.grpo_curve, ev.trace_budget_episodes),
        "expert_usage": plot_expert_usage(ev.expert_usage),
    }
    missing = {k: "this run has no data for it" for k, v in plots.items() if v is None}
    if no_subgoals:
        missing["subgoal_success"] = no_subgoals
    untrained = nothing_trained(m)
    if untrained:   # analysis.on_no_capability 'baselines': say why, not just that the data is absent
        missing["training_curves"] = f"no adapter was trained: {untrained}"
    no_reference = ev.arms_not_played.get("trace_routing")
    if no_reference and "expert_usage" in missing:
        missing["expert_usage"] = f"trace_routing was not played: {no_reference}"
    base = f"runs/{cfg.run_id}/report"
    outputs = {}
    for name, png in plots.items():
        if png is not None:
            outputs[name] = store.put_bytes(f"{base}/{name}.png", png).uri
    md = render_markdown(cfg, m, plots, missing, subgoals, no_subgoals)
    routed = routed_example_html(ev.routed_example) or (
        f"<p>No routed example: trace_routing was not played ({html.escape(no_reference)}).</p>" if no_reference
        else None)
    page = render_html(cfg, md, plots, routed)
    outputs["markdown"] = store.put_bytes(f"{base}/report.md", md.encode()).uri
    outputs["html"] = store.put_bytes(f"{base}/report.html", page.encode()).uri
    return {"outputs": outputs, "result": dump(ReportResult(missing_sections=missing))}


def nothing_trained(m: Manifest) -> str | None:
    """Why the run trained nothing (analysis.on_no_capability 'baselines': no capability retained, or no
    environment accepted), None when it trained adapters. The environments stage records either reason."""
    return results_of(m).environments.nothing_to_train


def _cell(text: str) -> str:
    """`text` safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _arm_tasks(a: ArmResult) -> str:
    """Tasks an arm played ('40 x 4' when it played 4 trials of each)."""
    return f"{a.tasks} x {a.trials}" if a.trials > 1 else str(a.episodes)


def _n(v: Any) -> str:
    """A count with thousands separators, '–' when unknown."""
    return "–" if v is None else f"{int(v):,}"


def _tokens(a: ArmResult) -> str:
    t = a.training_tokens
    if t is None:
        return "–"
    missing = a.training_tokens_missing
    return _n(t) + (f" (+ {', '.join(missing)}: not reported)" if missing and t else "")


def _ci(ci: list[float], signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(ci[0])} – {f.format(ci[1])}"


def _rate(b: Rate | None) -> str:
    return f"{b.pass_rate:.2f} ({b.n})" if b else "–"


def _not_available(missing: dict[str, str], name: str, why: str = "this run has no data for it") -> list[str]:
    missing[name] = why
    return ["", f"- {name}: not available ({why})"]


def paired_lines(ev: EvaluationResult, missing: dict[str, str]) -> list[str]:
    lines = ["", "## Paired comparison: TRACE routing vs each arm (same tasks)", ""]
    paired = ev.paired.vs if ev.paired else {}
    if not paired:
        no_reference = ev.arms_not_played.get("trace_routing")
        return lines[:-1] + _not_available(missing, "paired_comparison", f"trace_routing was not played: {no_reference}"
                                           if no_reference else "needs the trace_routing arm and per-task outcomes "
                                           "(an evaluation of this version)")
    ref = ev.paired.reference
    trials = max((c.trials or 1 for c in paired.values()), default=1)
    if trials > 1:
        lines += [f"{trials} trials per task: the task is the unit (its success share); p from a sign-flip "
                  "permutation over tasks; 'better' counts the tasks where one arm succeeded more often.", "",
                  f"| arm | tasks | {ref} | arm | difference | 95% CI (paired bootstrap over tasks) | {ref} better | "
                  "arm better | permutation p |", "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    else:
        lines += [f"| arm | tasks | {ref} | arm | difference | 95% CI (paired bootstrap) | only {ref} | only arm | "
                  "exact McNemar p |", "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for name, c in paired.items():
        lines.append(f"| {name} | {c.n} | {c.pass_rate_x:.3f} | {c.pass_rate_y:.3f} | {c.diff:+.3f} | "
                     f"{_ci(c.ci, signed=True)} | {c.only_x} | {c.only_y} | {c.p_value:.3g} |")
    power = ev.power
    if power is None:
        return lines
    if (power.trials or 1) > 1:
        return lines + trials_power_lines(power)
    n, mdd = power.n, power.min_detectable or {}
    if n and mdd:
        parts = [f"{'none' if v is None else f'{v:.3f}'} when {float(q):.0%} of the tasks are discordant"
                 for q, v in mdd.items()]
        lines += ["", f"Power: with {n} paired tasks, the smallest difference exact McNemar (two-sided, α = "
                  f"{power.alpha:g}) calls significant is " + ", ".join(parts) + "."]
        disc = power.observed_discordance or {}
        if disc:
            q = disc.get("grpo_target", sorted(disc.values())[len(disc) // 2])
            at = mcnemar_min_detectable(n, q, power.alpha)
            which = "against grpo_target" if "grpo_target" in disc else "median over the arms"
            verdict = ("resolvable" if at is not None and at <= PAPER_DIFFERENCE else "NOT resolvable")
            lines.append(f"Observed discordance {which}: {q:.0%}, where the smallest significant difference is "
                         f"{'none' if at is None else f'{at:.3f}'}: the paper's ≈ {PAPER_DIFFERENCE:.2f} difference is "
                         f"{verdict} at this test size.")
    return lines


def trials_power_lines(power: Power) -> list[str]:
    """The difference a several-trial evaluation resolves, from the observed spread of per-task differences."""
    mdd = power.min_detectable_observed or {}
    if not mdd:
        return []
    sds = power.observed_sd or {}
    parts = [f"{v:.3f} against {k} (per-task sd {sds[k]:.3f})" for k, v in mdd.items()]
    worst = mdd.get("grpo_target", sorted(mdd.values())[len(mdd) // 2])
    verdict = "resolvable" if worst <= PAPER_DIFFERENCE else "NOT resolvable"
    return ["", f"Power: with {power.n} paired tasks x {power.trials} trials, the difference a paired test "
            f"detects at {power.power:.0%} power (two-sided, α = {power.alpha:g}; normal "
            "approximation over tasks) is " + ", ".join(parts) + f": the paper's ≈ {PAPER_DIFFERENCE:.2f} difference "
            f"is {verdict} at this test size."]


def pass_hat_k_lines(arms: dict[str, ArmResult]) -> list[str]:
    """tau2's pass^k per arm, when the arms played several trials per task."""
    rows = {n: a.pass_hat_k for n, a in arms.items() if a.pass_hat_k}
    if not rows:
        return []
    ks = sorted({int(k) for r in rows.values() for k in r})
    lines = ["", "pass^k (tau2-bench: the chance that k trials of a task all succeed, mean over tasks):", "",
             "| arm | " + " | ".join(f"pass^{k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[str(k)]:.3f}" if str(k) in r else "–" for k in ks) + " |")
    return lines


def curve_lines(ev: EvaluationResult, missing: dict[str, str]) -> list[str]:
    lines = ["", "## GRPO on the target at several budgets (one run, its checkpoints)", ""]
    curve = ev.grpo_curve
    if not curve:
        return lines[:-1] + _not_available(missing, "grpo_budget_curve", "needs the grpo_target arm")
    budget = ev.trace_budget_episodes
    paired = ev.paired.vs if ev.paired else {}
    lines += [f"Multiples of TRACE's total budget ({_n(budget)} episodes); x = the trainer's own episode count at the "
              "checkpoint.", "", "| budget | iteration | training episodes | training tokens | pass rate | 95% CI | "
              "vs trace_routing: difference (p) |", "|---|---:|---:|---:|---:|---|---|"]
    for pt in curve:
        if pt.pass_rate is None:
            lines.append(f"| {pt.multiple:g}x | {pt.iteration} | – | – | – | – | not evaluated: {pt.skipped} |")
            continue
        c = paired.get(pt.name)
        vs = f"{0.0 - c.diff:+.3f} (p {c.p_value:.3g})" if c else "–"
        est = " (estimated)" if pt.estimated else ""
        lines.append(f"| {pt.multiple:g}x | {pt.iteration} | {_n(pt.training_episodes)}{est} | "
                     f"{_n(pt.training_tokens)} | {pt.pass_rate:.3f} | {_ci(pt.ci)} | {vs} |")
    ref = ev.arms.get("trace_routing")
    if ref:
        lines += ["", f"TRACE routing: {ref.pass_rate:.3f} ({_ci(ref.ci)}) at {_n(budget)} episodes."]
    return lines


def budget_lines(ev: EvaluationResult, missing: dict[str, str]) -> list[str]:
    lines = ["", "## Budget: every episode TRACE played", ""]
    b = ev.budget
    if not b:
        return lines[:-1] + _not_available(missing, "budget", "an evaluation of this version records it")
    lines += ["| component | episodes | prompt tokens | completion tokens | source |", "|---|---:|---:|---:|---|"]
    for name, comp in b.components.items():
        lines.append(f"| {name} | {_n(comp.episodes)} | {_n(comp.prompt_tokens)} | "
                     f"{_n(comp.completion_tokens)} | {comp.source} |")
        for env, e in (comp.per_environment or {}).items():
            extra = ""
            if e.earlier_attempts:
                extra = f"; {e.earlier_attempts} earlier attempt(s): {e.earlier_attempt_episodes} counted"
                if e.earlier_attempt_episodes_bound:
                    extra += f", {e.earlier_attempt_episodes_bound} bound from above (unrecorded)"
            lines.append(f"| &nbsp;&nbsp;{env} ({e.status.removeprefix('VALIDATION_STATUS_').lower()}) | "
                         f"{_n(e.episodes)} | – | – | final attempt {e.final_attempt}{extra} |")
        for cap, a in (comp.per_adapter or {}).items():
            lines.append(f"| &nbsp;&nbsp;{cap} | {_n(a.episodes)} | {_n(a.prompt_tokens)} | "
                         f"{_n(a.completion_tokens)} | {a.source} |")
        if name == "gates" and comp.warm_start_episodes is not None:
            what = "slot replays" if comp.warm_start_labels == "outcome" else "provenance"
            lines += [f"| &nbsp;&nbsp;warm start ({what}) | {_n(comp.warm_start_episodes)} | | | |",
                      f"| &nbsp;&nbsp;GRPO on the gates | {_n(comp.grpo_episodes)} | | | |"]
    lines.append(f"| **total** | **{_n(b.total_episodes)}** | {_n(b.total_prompt_tokens)} | "
                 f"{_n(b.total_completion_tokens)} | tokens without {', '.join(b.tokens_missing) or 'nothing'} |")
    return lines


def breakdown_lines(arms: dict[str, ArmResult], missing: dict[str, str]) -> list[str]:
    lines = ["", "## Per probe (single-capability tasks, pass rate (tasks))", ""]
    probed = {n: a.probes for n, a in arms.items() if a.probes}
    if probed:
        caps = sorted({c for pr in probed.values() for c in pr.by_probe})
        lines += ["| arm | all probes | " + " | ".join(caps) + " |", "|---|---:|" + "---:|" * len(caps)]
        for name, pr in probed.items():
            lines.append(f"| {name} | {pr.pass_rate:.2f} ({pr.episodes}) | "
                         + " | ".join(_rate(pr.by_probe.get(c)) for c in caps) + " |")
    else:
        lines = lines[:-1] + _not_available(missing, "per_probe", "no arm played the probe split "
                                            "(evaluation.probe_limit 0, or a target without probes)")
    lines += ["", "## Per required capability (held-out tasks needing it, pass rate (tasks))", ""]
    caps = sorted({c for a in arms.values() for c in a.breakdown})
    if not caps:
        return lines[:-1] + _not_available(missing, "per_capability")
    lines += ["| arm | " + " | ".join(caps) + " |", "|---|" + "---:|" * len(caps)]
    for name, a in arms.items():
        lines.append(f"| {name} | " + " | ".join(_rate(a.breakdown.get(c)) for c in caps) + " |")
    return lines


def subgoal_lines(subgoals: dict[str, dict[str, SubgoalRate]], missing: dict[str, str], why: str,
                  not_played: dict[str, str] | None = None) -> list[str]:
    """Per arm and capability: of the compound test tasks' sub-requests that needed the capability,
    how many did not fail on it (does an adapter raise its own skill where the target needs it?).
    Arms not played (`not_played`) have no row: one line names them."""
    lines = ["", "## Per-capability sub-goal success (compound test tasks: sub-requests needing it, met / all)", ""]
    if not_played:
        lines += [f"No row for the arms not played ({', '.join(not_played)}): see the arms table.", ""]
    if not subgoals:
        return lines[:-1] + _not_available(missing, "per_capability_subgoals", why)
    caps = sorted({c for r in subgoals.values() for c in r})
    lines += ["| arm | " + " | ".join(caps) + " |", "|---|" + "---:|" * len(caps)]
    for name, r in subgoals.items():
        cells = [f"{g.met} / {g.total} ({g.rate:.2f})" if (g := r.get(c)) and g.total else "–" for c in caps]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def tensorboard_lines(m: Manifest) -> list[str]:
    """Where each training job's TensorBoard event files are (`tensorboard --logdir` the directory)."""
    logs = {f"adapter {cap}": uri for cap, uri in results_of(m).adapters.tensorboard.items()}
    if m.stages["gates"].outputs.get("tensorboard"):
        logs["gates"] = m.stages["gates"].outputs["tensorboard"]
    if not logs:
        return []
    lines = ["", "## Training curves in TensorBoard", "",
             "Every iteration's metrics under TRL's names (`train/reward`, `train/kl`, ...): "
             "`tensorboard --logdir DIR` with DIR one of these (or the run directory, for all of them).", ""]
    return lines + [f"- {what}: `{uri.rsplit('/', 1)[0]}/`" for what, uri in logs.items()]


def render_markdown(cfg: RunConfig, m: Manifest, plots: dict[str, bytes | None], missing: dict[str, str],
                    subgoals: dict[str, dict[str, SubgoalRate]] | None = None, no_subgoals: str | None = None) -> str:
    """The markdown report of the run `m` (its records read through tracectl/run/results.py)."""
    results = results_of(m)
    ev, an = results.evaluation, results.analysis
    arms = ev.arms
    lines = [f"# TRACE run `{cfg.run_id}`", "", f"Target: `{cfg.target.env}`; base agent: `{cfg.base_agent.name}`; "
             f"analyst: `{an.mode or cfg.analysis.mode}`; environments: `{cfg.environments.mode}`.", "",
             "## Held-out pass rate per arm", "",
             "Training episodes: every episode the method played (TRACE: its whole budget, below).", "",
             "| arm | pass rate | 95% CI | tasks | training episodes | training tokens | wall s |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for name, a in arms.items():
        wall = a.wall_seconds_total if a.wall_seconds_total is not None else (a.wall_seconds or 0)
        lines.append(f"| {name} | {a.pass_rate:.3f} | {a.ci[0]:.3f}–{a.ci[1]:.3f} | {_arm_tasks(a)} | "
                     f"{_n(a.training_episodes)} | {_tokens(a)} | {wall:.0f} |")
    for name, why in ev.arms_not_played.items():
        lines.append(f"| {name} | not played: {_cell(why)} | | | | | |")
    lines += pass_hat_k_lines(arms)
    lines += paired_lines(ev, missing)
    lines += curve_lines(ev, missing)
    lines += budget_lines(ev, missing)
    lines += breakdown_lines(arms, missing)
    lines += subgoal_lines(subgoals or {}, missing, no_subgoals or "no arm records its test trajectories",
                           ev.arms_not_played)
    lines += ["", "## Capability analysis", "", "| candidate | retained | coverage | Δ | passing runs | reason |",
              "|---|---|---:|---:|---:|---|"]
    for c in an.candidates:
        lines.append(f"| {c.capability.name} | {'yes' if c.retained else 'no'} | "
                     f"{c.coverage_mean:.2f} | {c.gap_mean:.2f} | {c.passing_runs} | "
                     f"{c.rejection_reason} |")
    if (u := an.unexplained_failures) and u.failed:
        lines += ["", f"Failures no capability explains: {u.by_retained} of {u.failed} failed rollout episodes "
                  f"({u.by_retained / u.failed:.0%}) lack none of the retained capabilities ({u.by_candidates}, "
                  f"{u.by_candidates / u.failed:.0%}, none of the candidates): training those capabilities "
                  "cannot be expected to fix them."]
    if untrained := nothing_trained(m):
        lines += ["", f"Nothing trained: {untrained} (analysis.on_no_capability: baselines); environments, "
                  "adapters and gates completed empty."]
    lines += tensorboard_lines(m)
    lines += ["", "## Stages", "", "| stage | status | seconds | jobs |", "|---|---|---:|---|"]
    for name, rec in m.stages.items():
        secs = (rec.finished_at - rec.started_at) if rec.finished_at and rec.started_at else 0
        status = "this report" if name == "report" and rec.status == "running" else rec.status
        lines.append(f"| {name} | {status} | {secs:.0f} | {', '.join(rec.jobs[:4])} |")
    lines += ["", "## Plots", ""]
    for name in SECTIONS:
        if name in missing:
            lines.append(f"- {name}: not available ({missing[name]})")
        elif name in plots and plots[name] is not None:
            lines.append(f"![{name}]({name}.png)")
    return "\n".join(lines) + "\n"


def render_html(cfg: RunConfig, md: str, plots: dict[str, bytes | None], routed: str | None) -> str:
    """One self-contained page: the markdown report rendered (tables included), the plots as
    PNG data URIs, the routed example as coloured spans. Nothing is fetched from anywhere."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(
        "\n".join(line for line in md.splitlines() if not line.startswith(("![", "## Plots"))))
    imgs = "".join(f'<figure id="{k}"><img alt="{k}" src="data:image/png;base64,{base64.b64encode(v).decode()}">'
                   f"<figcaption>{k.replace('_', ' ')}</figcaption></figure>" for k, v in plots.items() if v)
    routed_html = routed or "<p>No routed example in this run.</p>"
    style = ("body{font-family:system-ui,sans-serif;max-width:1020px;margin:auto;padding:0 12px;color:#222}"
             "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px}"
             "td{text-align:right}td:first-child{text-align:left}th{background:#f3f3f3}"
             "figure{display:inline-block;margin:8px;vertical-align:top}img{max-width:480px}"
             f"{','.join(f'figure#{k} img' for k in WIDE_PLOTS)}{{max-width:100%}}"
             "pre.routed{white-space:pre-wrap;font-size:13px;line-height:1.6}")
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>TRACE run {html.escape(cfg.run_id)}</title><style>{style}</style></head><body>"
            f"{body}<h2>Plots</h2>{imgs}<h2 id='routed_example'>Example generation, tokens coloured by expert "
            f"(majority over layers; hover for the expert)</h2>{routed_html}</body></html>")
