"""PNG plots of an analysis result (matplotlib, Agg canvas; no global pyplot state, so the
service can render from a worker thread).

* `delta_vs_coverage.png` -- mean Delta against mean coverage per candidate, one-std error bars,
  with the rho (vertical) and delta (horizontal) threshold lines; retained candidates filled.
* `pass_matrix.png` -- capability x run: which runs each candidate passed (Cov >= rho and
  Delta >= delta), with the K-of-N count per row.
* `lacking_rates.png` -- per candidate, the fraction of failed and of passed trajectories
  labeled LACKING (means over runs), side by side.

Every title names the analyst mode, as every report does.
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

RETAINED, REJECTED = "#1b7f3b", "#9a9a9a"
PLOT_FILES = ("delta_vs_coverage.png", "pass_matrix.png", "lacking_rates.png")


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def _caps(report: dict[str, Any]) -> list[dict[str, Any]]:
    return report["retained"] + report["rejected"]


def delta_vs_coverage(report: dict[str, Any]) -> bytes:
    cfg = report["config"]
    fig = Figure(figsize=(7.5, 5.5))
    ax = fig.add_subplot()
    placed: list[tuple[float, float]] = []
    for c in _caps(report):
        retained = c["retained"]
        x, y = c["coverage_mean"], c["gap_mean"]
        # Stack the names of (nearly) coincident points instead of drawing them on top of each other.
        near = sum(abs(x - px) < 0.04 and abs(y - py) < 0.06 for px, py in placed)
        placed.append((x, y))
        color = RETAINED if retained else REJECTED
        ax.errorbar(c["coverage_mean"], c["gap_mean"], xerr=c["coverage_std"], yerr=c["gap_std"], fmt="o",
                    color=color, mfc=color if retained else "white", ms=8, capsize=3)
        ax.annotate(c["name"], (x, y), textcoords="offset points", xytext=(6, 6 - 11 * near), fontsize=8)
    ax.axvline(cfg["min_coverage"], color="#c0392b", ls="--", lw=1, label=f"rho = {cfg['min_coverage']:.2f}")
    ax.axhline(cfg["min_gap"], color="#2c3e99", ls="--", lw=1, label=f"delta = {cfg['min_gap']:.2f}")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("coverage  Cov = n_lf / |F|  (mean over runs)")
    ax.set_ylabel("contrastive gap  Delta = ER- - ER+  (mean over runs)")
    ax.set_title(f"Delta vs coverage -- mode: {report['mode']} "
                 f"({len(report['retained'])} retained of {len(_caps(report))})")
    ax.plot([], [], "o", color=RETAINED, label="retained")
    ax.plot([], [], "o", color=REJECTED, mfc="white", label="rejected")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def pass_matrix(report: dict[str, Any]) -> bytes:
    caps = _caps(report)
    n_runs = report["config"]["num_runs"]
    matrix = [[1 if r["passed"] else 0 for r in c["runs"]] for c in caps]  # [C, N]
    fig = Figure(figsize=(max(5.0, 0.45 * n_runs + 3.5), max(2.0, 0.4 * len(caps) + 1.5)))
    ax = fig.add_subplot()
    if caps:
        ax.imshow(matrix, cmap=ListedColormap(["#f2d7d5", "#1b7f3b"]), vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(n_runs), [str(i + 1) for i in range(n_runs)])
    ax.set_xticks([i - 0.5 for i in range(1, n_runs)], minor=True)
    ax.set_yticks([i - 0.5 for i in range(1, len(caps))], minor=True)
    ax.grid(which="minor", color="white", lw=2)
    ax.tick_params(which="minor", length=0)
    ax.set_yticks(range(len(caps)),
                  [f"{c['name']} ({c['passing_runs']}/{n_runs}{', kept' if c['retained'] else ''})" for c in caps])
    ax.set_xlabel(f"labeling run (pass = Cov >= rho and Delta >= delta; kept when >= "
                  f"{report['config']['min_passing_runs']} of {n_runs})")
    ax.set_title(f"Per-run pass matrix -- mode: {report['mode']}")
    return _png(fig)


def lacking_rates(report: dict[str, Any]) -> bytes:
    caps = _caps(report)
    fig = Figure(figsize=(7.5, max(2.5, 0.5 * len(caps) + 1.5)))
    ax = fig.add_subplot()
    ys = list(range(len(caps)))
    h = 0.38
    ax.barh([y - h / 2 for y in ys], [c["lacking_rate_failed"] for c in caps], height=h, color="#c0392b",
            label="failed trajectories")
    ax.barh([y + h / 2 for y in ys], [c["lacking_rate_passed"] for c in caps], height=h, color="#2c7fb8",
            label="passed trajectories")
    ax.set_yticks(ys, [c["name"] for c in caps])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction labeled LACKING (mean over runs)")
    ax.set_title(f"Lacking rate, failed vs passed -- mode: {report['mode']}")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def render_all(report: dict[str, Any]) -> dict[str, bytes]:
    return {"delta_vs_coverage.png": delta_vs_coverage(report), "pass_matrix.png": pass_matrix(report),
            "lacking_rates.png": lacking_rates(report)}
