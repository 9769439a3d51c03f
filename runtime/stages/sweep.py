"""sweep stage: the points of a fine-tuning sweep scored together, one point selected.

Contract (docs/STAGES.md): params a ``SweepSpec`` (compiler/specs/sweep.py: ``task``,
``points``: point name -> its settings, ``varied``, ``select_metric``, ``export_point``,
``rule``); inputs ``finetune_dirs`` (point name -> its finetune stage directory, holding
``metrics.json``). Writes:

- ``sweep.json``: each point's settings, seed and dev score; each setting (a point without
  its seed) with its seeds' scores, their mean and sample standard deviation; the
  ``selected`` setting (the highest mean; ties: the first in the grid) and its best seed's
  point; the ``exported`` point (``export_point``, else that one); the rule and the metric.
- ``metrics.json``: the selected setting's dev-set metrics, each the mean over its seeds
  (``std`` beside them), in the finetune stage's layout (``kind``, ``metrics``,
  ``dev_sets``, ...), so a suite (runtime/stages/suite.py) scores a swept task by it.
- ``grid.png``: the dev score against the first swept setting, one line per combination of
  the others, each seed a dot, the mean with its standard deviation, the selected marked.

A point's dev score is the mean of ``select_metric`` over the task's dev sets, or (unset) the
task score: the mean of its metrics over its dev sets (runtime/glue_score.py). No TensorFlow.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from typing import Optional

from runexp.compiler.specs import SweepSpec
from runexp.compiler.specs.finetune import DevScores, FinetuneMetrics, Scores
from runexp.compiler.specs.sweep import SweepMetrics, SweepSummary
from runexp.compiler.specs.task_kinds import ACCURACY
from runexp.compiler.sweep import value_text
from runexp.runtime.glue_score import task_score

SWEEP_FILE = "sweep.json"
METRICS_FILE = "metrics.json"  # each finetune stage's, and this stage's
GRID_FILE = "grid.png"
SEED = "seed"


def point_score(metrics: dict, metric: Optional[str]) -> float:
    """A point's dev score: ``metric``'s mean over its dev sets, or the task score."""
    run = FinetuneMetrics.read(metrics)
    names = [metric] if metric else run.scored_by
    return task_score({name: {m: scores.values[m] for m in names}
                       for name, scores in run.dev_scores().items()}, names)


def setting_name(point: str, settings: dict) -> str:
    """The point's name without its seed ('lr3e-5.s1' -> 'lr3e-5'); 'all' for a grid of
    seeds only."""
    if SEED not in settings:
        return point
    return point.rsplit(".", 1)[0] if "." in point else "all"


def _mean_std(values: list[float]) -> tuple[float, Optional[float]]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def select(spec: SweepSpec, metrics: dict[str, dict]) -> dict:
    """sweep.json's contents from each point's metrics.json contents (point name -> dict)."""
    points = {}
    for name, settings in spec.points.items():
        points[name] = {"settings": dict(settings), "seed": settings.get(SEED),
                        "score": point_score(metrics[name], spec.select_metric),
                        "setting": setting_name(name, settings)}
    groups: dict[str, dict] = {}
    for name, point in points.items():  # in grid order: the seed varies fastest
        group = groups.setdefault(point["setting"], {
            "name": point["setting"], "points": [], "seeds": [], "scores": [],
            "settings": {k: v for k, v in point["settings"].items() if k != SEED}})
        group["points"].append(name)
        group["seeds"].append(point["seed"])
        group["scores"].append(point["score"])
    for group in groups.values():
        group["mean"], group["std"] = _mean_std(group["scores"])
    best = max(groups.values(), key=lambda g: g["mean"])  # max keeps the first of equals
    best_point = max(best["points"], key=lambda n: points[n]["score"])
    exported = spec.export_point or best_point
    run = FinetuneMetrics.read(next(iter(metrics.values())))
    names = run.scored_by
    label = spec.select_metric or (names[0] if len(names) == 1 else
                                   f"task score (mean of {', '.join(names)})")
    first = next(iter(run.dev_scores().values()), DevScores())
    baseline = first.majority_baseline if label == ACCURACY else None
    edges = []  # a selected value at the end of its range: the best may lie beyond it
    for param in spec.varied:
        values = sorted({g["settings"][param] for g in groups.values()})
        chosen = best["settings"][param]
        if len(values) > 1 and chosen in (values[0], values[-1]):
            edges.append(f"{param} {value_text(chosen)} is the "
                         f"{'largest' if chosen == values[-1] else 'smallest'} value tried: "
                         "the best may lie beyond it")
    return {"task": spec.task, "metric": label, "majority_baseline": baseline,
            "at_edge": edges,
            "rule": spec.rule, "varied": list(spec.varied), "points": points,
            "settings": list(groups.values()),
            "selected": {"setting": best["name"], "point": best_point, "mean": best["mean"],
                         "std": best["std"], "seeds": len(best["points"])},
            "exported": exported,
            "exported_why": "finetune.export_point" if spec.export_point else
                            "the selected setting's best seed"}


def selected_metrics(sweep: dict, metrics: dict[str, dict]) -> dict:
    """metrics.json of the selected setting: each dev-set metric the mean over its seeds."""
    chosen = next(g for g in sweep["settings"] if g["name"] == sweep["selected"]["setting"])
    runs = [FinetuneMetrics.read(metrics[p]) for p in chosen["points"]]
    first, names = runs[0], runs[0].scored_by
    dev_sets, std = {}, {}
    for dev, scores in first.dev_scores().items():
        means, std[dev] = {}, {}
        for key in scores.to_dict():
            values = [run.dev_scores()[dev].to_dict().get(key) for run in runs]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                continue
            means[key], spread = _mean_std([float(v) for v in values])
            if key in names:
                std[dev][key] = spread
        dev_sets[dev] = DevScores.read(means)
    first_set = next(iter(dev_sets.values()), DevScores())
    return SweepMetrics(
        scores=Scores(values={m: first_set.values[m] for m in names if m in first_set.values}),
        kind=first.kind, metrics=names, dev_sets=dev_sets, num_labels=first.num_labels,
        dev_examples=first.dev_examples, train_examples=first.train_examples,
        labels=first.labels, text_fields=first.text_fields, max_seq_length=first.max_seq_length,
        std=std, point=chosen["name"], points=chosen["points"], seeds=len(chosen["points"]),
        exported=sweep["exported"]).to_dict()


def _short(param: str) -> str:
    return param.replace("_", " ")


def grid_figure(sweep: dict):
    """The grid as one figure: the dev score against the first swept setting (a log axis
    for a learning rate), one line per combination of the others; seeds as dots, means with
    their standard deviation as error bars; the selected setting ringed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 4.8), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    varied = sweep["varied"]
    x_param = varied[0] if varied else None
    lines: dict[tuple, list] = {}
    for group in sweep["settings"]:
        rest = tuple((k, group["settings"][k]) for k in varied[1:])
        lines.setdefault(rest, []).append(group)
    colors = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
    for i, (rest, groups) in enumerate(lines.items()):
        color = colors[i % len(colors)]
        xs = [g["settings"][x_param] if x_param else 0 for g in groups]
        order = sorted(range(len(xs)), key=lambda j: xs[j])
        xs = [xs[j] for j in order]
        groups = [groups[j] for j in order]
        label = ", ".join(f"{_short(k)} {value_text(v)}" for k, v in rest) or None
        ax.errorbar(xs, [g["mean"] for g in groups], yerr=[g["std"] or 0 for g in groups],
                    color=color, marker="o", capsize=4, label=label, linewidth=1.5)
        for x, g in zip(xs, groups):
            ax.scatter([x] * len(g["scores"]), g["scores"], color=color, s=12, alpha=0.5,
                       zorder=3)
            if g["name"] == sweep["selected"]["setting"]:
                ax.scatter([x], [g["mean"]], s=220, facecolors="none", edgecolors="black",
                           linewidths=1.5, zorder=4, label="selected")
    if x_param:
        xs_all = [g["settings"][x_param] for g in sweep["settings"]]
        if min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 10 or x_param == "learning_rate":
            ax.set_xscale("log")
        ax.set_xticks(sorted(set(xs_all)))
        ax.set_xticklabels([value_text(x) for x in sorted(set(xs_all))])
        ax.minorticks_off()
        ax.set_xlabel(_short(x_param))
    else:
        ax.set_xticks([])
    if sweep.get("majority_baseline") is not None:
        ax.axhline(sweep["majority_baseline"], color="#555555", linestyle="--", linewidth=1,
                   label="majority class")
    seeds = max(len(g["scores"]) for g in sweep["settings"])
    ax.set_ylabel(f"dev {sweep['metric']}")
    ax.set_title(f"sweep of {sweep['task']}: dev {sweep['metric']}"
                 + (f", mean ± std over {seeds} seeds (dots: each seed)" if seeds > 1 else ""))
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=9, loc="best")
    fig.tight_layout()
    return fig


def grid_png(sweep: dict) -> bytes:
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = grid_figure(sweep)
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _number(value: Optional[float]) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.4f}"


def run(ctx) -> SweepSummary:
    spec = SweepSpec.from_stage(ctx)
    metrics = {}
    for name in spec.points:
        with open(os.path.join(ctx.inputs["finetune_dirs"][name], METRICS_FILE),
                  encoding="utf-8") as f:
            metrics[name] = json.load(f)
    sweep = select(spec, metrics)
    for name, data in ((SWEEP_FILE, sweep), (METRICS_FILE, selected_metrics(sweep, metrics))):
        with open(os.path.join(ctx.work_dir, name), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    try:
        with open(os.path.join(ctx.work_dir, GRID_FILE), "wb") as f:
            f.write(grid_png(sweep))
    except Exception as e:  # noqa: BLE001 - a picture that fails is a warning, never a failure
        ctx.progress(f"WARNING: {GRID_FILE} could not be drawn: {e}")
    for group in sweep["settings"]:
        mark = "  <- selected" if group["name"] == sweep["selected"]["setting"] else ""
        ctx.progress(f"{group['name']}: {sweep['metric']} {_number(group['mean'])} ± "
                     f"{_number(group['std'])} over {len(group['scores'])} seed(s) "
                     f"({', '.join(_number(s) for s in group['scores'])}){mark}")
    sel = sweep["selected"]
    ctx.progress(f"selected {sel['setting']} ({sweep['metric']} {_number(sel['mean'])}); "
                 f"exported: {sweep['exported']} ({sweep['exported_why']})")
    for edge in sweep["at_edge"]:
        ctx.progress(f"NOTE: {edge}: extend the grid")
    return SweepSummary(selected=sel["setting"], mean=sel["mean"], std=sel["std"],
                        exported=sweep["exported"], points=len(spec.points),
                        metric=sweep["metric"])
