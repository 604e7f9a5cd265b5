"""The training-curve PNG written next to each adapter (matplotlib, Agg backend: no display).

Three panels over iterations, from the trainer's per-iteration metrics (trainer.py):
    rewards   reward mean (+- std), guided and unguided reward mean, pass rate
    signal    informative-group fraction, guided share of the iteration's episodes
    loss      loss, KL, entropy
A metric an iteration did not report (no guided episode, no update) is a gap in its line; a
metric no iteration reported is not drawn.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

#: panel -> (metric, legend label, colour) drawn in it, in order.
PANELS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "rewards": (("reward_mean", "reward mean", "tab:blue"),
                ("guided_reward_mean", "guided reward", "tab:olive"),
                ("unguided_reward_mean", "unguided reward", "tab:cyan"),
                ("pass_rate", "pass rate", "tab:green")),
    "signal": (("informative_group_fraction", "informative-group fraction", "tab:orange"),
               ("guided_share", "guided share of episodes", "tab:brown")),
    "loss": (("loss", "loss", "tab:red"), ("kl", "kl", "tab:purple"), ("entropy", "entropy", "tab:gray")),
}


def training_curve_figure(history: Sequence[dict[str, float]], title: str = "") -> Any:
    """The figure (a matplotlib `Figure`) of `training_curve_png`; its lines carry the legend labels
    of `PANELS`."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    its = [h.get("iteration", i + 1) for i, h in enumerate(history)]

    def series(name: str) -> list[float] | None:
        vals = [h.get(name) for h in history]
        return None if all(v is None for v in vals) else [float("nan") if v is None else float(v) for v in vals]

    fig = Figure(figsize=(8, 8), dpi=100)
    axes = dict(zip(PANELS, fig.subplots(len(PANELS), 1, sharex=True), strict=True))
    for panel, lines in PANELS.items():
        ax = axes[panel]
        for name, label, color in lines:
            s = series(name)
            if s is None:
                continue
            ax.plot(its, s, label=label, color=color, marker="." if len(its) < 30 else None)
            if name == "reward_mean" and (std := series("reward_std")) is not None:
                ax.fill_between(its, [m - d for m, d in zip(s, std, strict=True)],
                                [m + d for m, d in zip(s, std, strict=True)], color=color, alpha=0.15)
        if panel != "loss":
            ax.set_ylim(-0.05, 1.05)
        ax.set_ylabel({"rewards": "reward", "signal": "fraction", "loss": "loss / kl / entropy"}[panel])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
    axes["loss"].set_xlabel("iteration")
    if title:
        fig.suptitle(title)
    return fig


def training_curve_png(history: Sequence[dict[str, float]], title: str = "") -> bytes:
    """The PNG of `training_curve_figure` (module docstring)."""
    buf = io.BytesIO()
    training_curve_figure(history, title).savefig(buf, format="png")
    return buf.getvalue()
