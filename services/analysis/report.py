"""Human-readable report of an analysis result (markdown) and the summary table rows that
`tracectl analyze` prints.

The report reads only `report.json`'s dict (AnalysisResult.to_dict), so it can be re-rendered
from the artifact alone. Evidence quotes and task ids come from untrusted trajectories (and,
in LLM mode, from the model): they are shown inside code spans with backticks and newlines
removed, so they cannot inject markdown (links, images, headings) into the report.
"""

from __future__ import annotations

from typing import Any

MODE_TEXT = {
    "llm": "llm -- labels from the prompted analyst LLM; runs are independent labeling passes",
    "diagnostics": "diagnostics -- labels derived from environment diagnostics; runs are bootstrap resamples",
}


def _code(text: str, limit: int = 220) -> str:
    text = " ".join(str(text).split()).replace("`", "'")
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return f"`{text}`" if text else "``"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _pm(mean: float, std: float) -> str:
    return f"{mean:.2f} ± {std:.2f}"


def _kappa(c: dict[str, Any]) -> str:
    return "n/a" if c.get("kappa") is None else f"{c['kappa']:.2f}"


def table_rows(report: dict[str, Any]) -> list[dict[str, str]]:
    """One row per candidate, retained first: the columns tracectl prints."""
    n = report["config"]["num_runs"]
    rows = []
    for c in report["retained"] + report["rejected"]:
        rows.append({"capability": c["name"], "decision": "retained" if c["retained"] else
                     f"rejected ({c['rejection_reason']})", "passing": f"{c['passing_runs']}/{n}",
                     "coverage": _pm(c["coverage_mean"], c["coverage_std"]),
                     "gap": _pm(c["gap_mean"], c["gap_std"]), "er_minus": f"{c['er_minus_mean']:.2f}",
                     "er_plus": f"{c['er_plus_mean']:.2f}", "kappa": _kappa(c),
                     "failed_tasks": str(len(c["failed_task_ids"]))})
    return rows


def unexplained_lines(report: dict[str, Any]) -> list[str]:
    """The share of failures no capability explains (report.json's unexplained_failures)."""
    u = report.get("unexplained_failures")
    if not u:
        return []
    r, c = u["retained"], u["candidates"]
    ids = ", ".join(_code(t, 40) for t in r["task_ids"])
    return [f"- Failures no capability explains: {r['unexplained']} of {r['failed']} failed trajectories "
            f"({r['share']:.0%}) are LACKING none of the retained capabilities ({c['unexplained']}, "
            f"{c['share']:.0%}, none of the candidates): training the retained capabilities cannot be "
            f"expected to fix them" + (f"; e.g. tasks {ids}" if ids else "")]


def render_markdown(report: dict[str, Any], plot_files: list[str]) -> str:
    cfg, inputs = report["config"], report["inputs"]
    mode = report["mode"]
    lines = [f"# Contrastive capability analysis -- job {report['job_id']}", ""]
    lines += [f"**Analyst mode: {MODE_TEXT.get(mode, mode)}**", ""]
    if report.get("analyst", {}).get("model"):
        lines += [f"Analyst model: {_code(report['analyst']['model'])} at {_code(report['analyst']['base_url'])}", ""]
    lines += [
        f"- Run: {_code(report['run_id'] or '(none)')}",
        f"- Trajectories: {inputs['n_trajectories']} ({inputs['n_failed']} failed, {inputs['n_passed']} passed) "
        f"from {len(inputs['rollout_uris'])} artifact(s)",
        f"- Retention rule: a run passes a capability when Cov >= rho = {cfg['min_coverage']:.2f} and "
        f"Delta >= delta = {cfg['min_gap']:.2f}; retained when it passes in >= K = {cfg['min_passing_runs']} "
        f"of N = {cfg['num_runs']} runs (seed {cfg['seed']})",
        f"- Retained: {', '.join(c['name'] for c in report['retained']) or 'none'}",
        *unexplained_lines(report), "",
        "## Candidates", "",
        "| capability | decision | passing runs | Cov (mean ± std) | Delta (mean ± std) | ER- | ER+ | kappa "
        "| failed tasks LACKING |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table_rows(report):
        lines.append("| " + " | ".join(_cell(row[k]) for k in ("capability", "decision", "passing", "coverage",
                                                                   "gap", "er_minus", "er_plus", "kappa",
                                                                   "failed_tasks")) + " |")
    lines.append("")
    for title, caps in (("Retained capabilities", report["retained"]), ("Rejected capabilities", report["rejected"])):
        lines += [f"## {title}", ""]
        if not caps:
            lines += ["None.", ""]
        for c in caps:
            lines += [f"### {c['name']}", "", _code(c["description"], 600), ""]
            if not c["retained"]:
                lines += [f"Rejected on **{c['rejection_reason']}** ({c['passing_runs']} of {cfg['num_runs']} "
                          "runs passed).", ""]
            lines.append(f"- Lacking rate: failed {c['lacking_rate_failed']:.2f}, passed "
                         f"{c['lacking_rate_passed']:.2f}; kappa {_kappa(c)} ({c['kappa_note']})")
            ids = c["failed_task_ids"]
            shown = ", ".join(_code(t, 40) for t in ids[:20]) + (f" ... (+{len(ids) - 20})" if len(ids) > 20 else "")
            lines.append(f"- Failed task ids where LACKING ({len(ids)}): {shown or 'none'}")
            for quote in c["evidence"]:
                lines.append(f"- Evidence: {_code(quote)}")
            lines.append("")
    if plot_files:
        lines += ["## Plots", ""]
        lines += [f"![{name}]({name})" for name in plot_files]
        lines.append("")
    if report["warnings"]:
        lines += ["## Warnings", ""] + [f"- {_code(w, 400)}" for w in report["warnings"]] + [""]
    lines += ["Every number above is in `report.json` (per-run counts n_lf, n_pf, n_lp, n_pp per capability); "
              "the labels behind them are in `labels.jsonl`.", ""]
    return "\n".join(lines)
