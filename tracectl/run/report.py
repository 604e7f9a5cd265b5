"""The run report: markdown plus a self-contained HTML page (plots embedded as PNG data URIs).

Every number comes from the manifest (which points at the jobs and artifacts that made it).
Sections whose inputs a run does not have say so explicitly instead of disappearing.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from trace_common.artifacts import ArtifactStore  # noqa: E402
from tracectl.run.config import RunConfig  # noqa: E402
from tracectl.run.manifest import Manifest  # noqa: E402

SECTIONS = ("pass_rate_per_arm", "candidates", "training_curves", "sample_efficiency", "expert_usage",
            "routed_example")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def plot_arms(arms: dict[str, dict[str, Any]]) -> bytes | None:
    if not arms:
        return None
    names = list(arms)
    rates = [arms[n]["pass_rate"] for n in names]
    lo = [r - arms[n]["ci"][0] for n, r in zip(names, rates, strict=True)]
    hi = [arms[n]["ci"][1] - r for n, r in zip(names, rates, strict=True)]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(names, rates, yerr=[lo, hi], capsize=5, color=["#888" if n == "base" else "#3b7dd8" for n in names])
    ax.set_ylabel("held-out pass rate (95% CI)")
    ax.set_ylim(0, 1)
    ax.set_title("Pass rate per arm")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    return _png(fig)


def plot_candidates(cands: list[dict[str, Any]], rho: float, delta: float) -> bytes | None:
    if not cands:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for c in cands:
        x, y = c.get("coverage_mean", 0.0), c.get("gap_mean", 0.0)
        ax.scatter([x], [y], color="#2a9d4b" if c.get("retained") else "#c0392b", s=40)
        ax.annotate(c["capability"]["name"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
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


def plot_sample_efficiency(arms: dict[str, dict[str, Any]]) -> bytes | None:
    if not arms:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, a in arms.items():
        ax.errorbar([a.get("training_rollouts", 0)], [a["pass_rate"]],
                    yerr=[[a["pass_rate"] - a["ci"][0]], [a["ci"][1] - a["pass_rate"]]], fmt="o", capsize=4,
                    label=name)
    ax.set_xlabel("training rollouts spent")
    ax.set_ylabel("held-out pass rate")
    ax.set_ylim(0, 1)
    ax.set_title("Reward vs rollouts (sample efficiency)")
    ax.legend(fontsize=7)
    return _png(fig)


def plot_expert_usage(usage: dict[str, Any]) -> bytes | None:
    """usage: {"experts": [...], "rows": {task_type: [[count per expert] per position bucket]}}"""
    rows = usage.get("rows") if usage else None
    if not rows:
        return None
    import numpy as np

    experts = usage["experts"]
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.2), squeeze=False)
    for ax, (task, grid) in zip(axes[0], sorted(rows.items()), strict=True):
        arr = np.asarray(grid, dtype=float)
        arr = arr / np.maximum(arr.sum(axis=1, keepdims=True), 1)
        ax.imshow(arr.T, aspect="auto", cmap="viridis", vmin=0, vmax=1)
        ax.set_title(task, fontsize=8)
        ax.set_yticks(range(len(experts)), experts, fontsize=6)
        ax.set_xlabel("token position bucket", fontsize=7)
    fig.suptitle("Expert usage (share of tokens) by position and task type", fontsize=9)
    return _png(fig)


def routed_example_html(example: dict[str, Any]) -> str | None:
    toks = example.get("tokens") if example else None
    if not toks:
        return None
    palette = ["#ddd", "#8ecae6", "#ffb703", "#90be6d", "#f28482", "#cdb4db", "#b5e48c", "#f4a261", "#a8dadc"]
    spans = [f'<span title="{html.escape(e)}" style="background:{palette[i % len(palette)]}">{html.escape(tok)}</span>'
             for tok, i, e in ((t["text"], t["expert_index"], t["expert"]) for t in toks)]
    legend = " ".join(f'<span style="background:{palette[i % len(palette)]}">{html.escape(n)}</span>'
                      for i, n in enumerate(example.get("experts", [])))
    return f"<p>{legend}</p><pre class='routed'>{''.join(spans)}</pre>"


def write_report(cfg: RunConfig, m: Manifest, store: ArtifactStore) -> dict[str, Any]:
    ev = m.stages["evaluation"].result
    arms = ev.get("arms", {})
    an = m.stages["analysis"].result
    adapters = m.stages["adapters"]
    curves: dict[str, list[dict[str, float]]] = {}
    for cap, res in adapters.result.get("curves", {}).items():
        curves[cap] = _curve(store, res)
    usage = ev.get("expert_usage", {})
    example = ev.get("routed_example", {})
    plots = {
        "pass_rate_per_arm": plot_arms(arms),
        "candidates": plot_candidates(an.get("candidates", []), cfg.analysis.min_coverage, cfg.analysis.min_gap),
        "training_curves": plot_curves(curves, "iteration", "reward_mean", "Training reward per adapter"),
        "sample_efficiency": plot_sample_efficiency(arms),
        "expert_usage": plot_expert_usage(usage),
    }
    missing = {k: "this run has no data for it" for k, v in plots.items() if v is None}
    base = f"runs/{cfg.run_id}/report"
    outputs = {}
    for name, png in plots.items():
        if png is not None:
            outputs[name] = store.put_bytes(f"{base}/{name}.png", png).uri
    md = render_markdown(cfg, m, arms, an, plots, missing)
    page = render_html(cfg, md, plots, routed_example_html(example))
    outputs["markdown"] = store.put_bytes(f"{base}/report.md", md.encode()).uri
    outputs["html"] = store.put_bytes(f"{base}/report.html", page.encode()).uri
    return {"outputs": outputs, "result": {"missing_sections": missing}}


def render_markdown(cfg: RunConfig, m: Manifest, arms, an, plots, missing) -> str:
    lines = [f"# TRACE run `{cfg.run_id}`", "", f"Target: `{cfg.target.env}`; base agent: `{cfg.base_agent.name}`; "
             f"analyst: `{an.get('mode', cfg.analysis.mode)}`; environments: `{cfg.environments.mode}`.", "",
             "## Held-out pass rate per arm", "",
             "| arm | pass rate | 95% CI | episodes | training rollouts | wall s |", "|---|---:|---|---:|---:|---:|"]
    for name, a in arms.items():
        lines.append(f"| {name} | {a['pass_rate']:.3f} | {a['ci'][0]:.3f}–{a['ci'][1]:.3f} | {a['episodes']} | "
                     f"{a.get('training_rollouts', 0)} | {a.get('wall_seconds_total', a.get('wall_seconds', 0)):.0f} |")
    caps = sorted({c for a in arms.values() for c in a.get("breakdown", {})})
    if caps:
        lines += ["", "### Per capability (task type)", "", "| arm | " + " | ".join(caps) + " |",
                  "|---|" + "---:|" * len(caps)]
        for name, a in arms.items():
            b = a.get("breakdown", {})
            lines.append(f"| {name} | " + " | ".join(f"{b[c]['pass_rate']:.2f}" if c in b else "–" for c in caps)
                         + " |")
    lines += ["", "## Capability analysis", "", "| candidate | retained | coverage | Δ | passing runs | reason |",
              "|---|---|---:|---:|---:|---|"]
    for c in an.get("candidates", []):
        lines.append(f"| {c['capability']['name']} | {'yes' if c.get('retained') else 'no'} | "
                     f"{c.get('coverage_mean', 0):.2f} | {c.get('gap_mean', 0):.2f} | {c.get('passing_runs', 0)} | "
                     f"{c.get('rejection_reason', '')} |")
    lines += ["", "## Stages", "", "| stage | status | seconds | jobs |", "|---|---|---:|---|"]
    for name, rec in m.stages.items():
        secs = (rec.finished_at - rec.started_at) if rec.finished_at and rec.started_at else 0
        lines.append(f"| {name} | {rec.status} | {secs:.0f} | {', '.join(rec.jobs[:4])} |")
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
             "pre.routed{white-space:pre-wrap;font-size:13px;line-height:1.6}")
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>TRACE run {html.escape(cfg.run_id)}</title><style>{style}</style></head><body>"
            f"{body}<h2>Plots</h2>{imgs}<h2 id='routed_example'>Example generation, tokens coloured by expert "
            f"(majority over layers; hover for the expert)</h2>{routed_html}</body></html>")
