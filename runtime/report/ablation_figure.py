"""The ablation figure: held-out masked-LM accuracy and loss against instances seen, a colour
per group of points, the mean of its seeds over a band from their minimum to their maximum.
runtime/report/ablations.py groups the runs and compares them; this module only draws.
matplotlib is imported when a figure is drawn, not with the report.
"""

from __future__ import annotations

import statistics
from typing import Optional

from runexp.compiler.specs import TrainSpec

_DPI = 100
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
# The panels, also the columns of the ablation table:
# (eval_log.jsonl key, panel title, y label, an accuracy in [0, 1])
METRICS = (("mlm_accuracy", "Held-out masked-LM accuracy", "accuracy (masked tokens)", True),
            ("mlm_loss", "Held-out masked-LM loss", "cross-entropy (nats per masked token)",
             False))


def _mean_curve(runs: list, key: str) -> tuple[list, list, list, list]:
    """(x, mean, min, max) of the runs at the evaluations every one of them made."""
    series = [dict(r.xs(key)) for r in runs]
    xs = sorted(set.intersection(*(set(s) for s in series))) if series else []
    ys = [[s[x] for s in series] for x in xs]
    return (xs, [statistics.fmean(v) for v in ys], [min(v) for v in ys],
            [max(v) for v in ys])


def _thousands(value: float, _pos=None) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def _x_label(runs: list) -> str:
    if any(r.rows_only for r in runs):
        return "rows seen for packed stages without a measured factor, instances for the others"
    per = {r.per_step for r in runs}
    if len(per) == 1:
        (p,) = per
        return f"instances seen (step × {p:,.4g} instances a step)"
    return "instances seen (step × the stage's instances a step)"


def _planned_end(runs: list) -> float:
    """The instances seen at the last planned step of the longest run (0: not known)."""
    ends = [TrainSpec.from_stage(r.sr.stage).train_steps * (r.per_step or 1.0) for r in runs]
    return max(ends, default=0.0)


def figure(title: str, groups: list, at: Optional[float]):
    """The figure: accuracy and loss against instances seen, a colour per group."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    fig = Figure(figsize=(14.0, 6.0), dpi=_DPI, layout="constrained")
    fig.suptitle(title, fontsize=13, fontweight="bold")
    axes = fig.subplots(1, len(METRICS), squeeze=False).ravel()
    runs = [run for g in groups for run in g.runs]
    handles = []
    for i, g in enumerate(groups):
        color = _COLORS[i % len(_COLORS)]
        handles.append(Line2D([], [], color=color, lw=2.4, marker="o", ms=5, label=g.label))
    for ax, (key, name, ylabel, percent) in zip(axes, METRICS):
        ax.runexp_key = key
        for i, g in enumerate(groups):
            color = _COLORS[i % len(_COLORS)]
            for run in g.runs:
                pts = run.xs(key)
                if pts:
                    ax.plot(*zip(*pts), color=color, lw=0.8, alpha=0.45,
                            label=f"_{run.sr.stage.id}")
            xs, mean, lo, hi = _mean_curve(g.runs, key)
            if xs:
                if len(g.runs) > 1:
                    ax.fill_between(xs, lo, hi, color=color, alpha=0.18, lw=0)
                ax.plot(xs, mean, color=color, lw=2.4, marker="o", ms=5, label=g.label)
        if at is not None:
            ax.axvline(at, color="#555555", lw=1.0, ls=":")
        ax.set_title(name, fontsize=12)
        ax.set_ylabel(ylabel)
        ax.set_xlabel(_x_label(runs))
        ax.set_xlim(0, max(_planned_end(runs), ax.get_xlim()[1]))
        ax.grid(True, alpha=0.3)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        ax.xaxis.set_major_formatter(FuncFormatter(_thousands))
        if percent:
            ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=None))
    handles += [Line2D([], [], color="#777777", lw=0.8, alpha=0.7, label="one seed"),
                Patch(color="#777777", alpha=0.25, label="min–max of the seeds")]
    if at is not None:
        handles.append(Line2D([], [], color="#555555", lw=1.0, ls=":",
                              label="compared in the table"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6),
               fontsize=10, frameon=False)
    return fig
