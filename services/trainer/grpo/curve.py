"""The training-curve PNG written next to each adapter (matplotlib, Agg backend: no display)."""

from __future__ import annotations

import io
from collections.abc import Sequence


def training_curve_png(history: Sequence[dict[str, float]], title: str = "") -> bytes:
    """Two panels over iterations: reward mean (+- std), pass rate and informative-group
    fraction; loss, KL and entropy. Missing metrics are skipped."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    its = [h.get("iteration", i + 1) for i, h in enumerate(history)]

    def series(name: str) -> list[float] | None:
        vals = [h.get(name) for h in history]
        return None if all(v is None for v in vals) else [float("nan") if v is None else v for v in vals]

    fig = Figure(figsize=(8, 6), dpi=100)
    top, bottom = fig.subplots(2, 1, sharex=True)
    mean, std = series("reward_mean"), series("reward_std")
    if mean is not None:
        top.plot(its, mean, label="reward mean", color="tab:blue")
        if std is not None:
            top.fill_between(its, [m - s for m, s in zip(mean, std, strict=True)],
                             [m + s for m, s in zip(mean, std, strict=True)], color="tab:blue", alpha=0.15)
    for name, color in (("pass_rate", "tab:green"), ("informative_group_fraction", "tab:orange")):
        s = series(name)
        if s is not None:
            top.plot(its, s, label=name.replace("_", " "), color=color)
    top.set_ylim(-0.05, 1.05)
    top.set_ylabel("reward / fraction")
    if top.get_legend_handles_labels()[0]:
        top.legend(loc="lower right", fontsize=8)
    top.grid(alpha=0.3)
    for name, color in (("loss", "tab:red"), ("kl", "tab:purple"), ("entropy", "tab:gray")):
        s = series(name)
        if s is not None:
            bottom.plot(its, s, label=name, color=color)
    bottom.set_xlabel("iteration")
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(loc="upper right", fontsize=8)
    bottom.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
