"""A training stage's curves, drawn from its logs as one PNG (``curves.png``).

Data: the stage's ``train_log.jsonl`` (one record per ``log_every`` steps: metrics of that
window, learning rate, examples/s, gradient norm; records with an ``"event"`` key are events
such as ``deadline_stop``, drawn as vertical lines) and ``eval_log.jsonl`` (held-out metrics
every ``eval_every`` steps), both written by runtime/train_log.py and read, streamed, by
runtime/log_reader.py: of a long run's records at most ``log_reader.CURVE_POINTS`` per log
are kept, evenly through it (and the last). Every panel shares the step
axis. References are drawn where they are known (``references``): the most-frequent-token
and majority-class baselines, chance for NSP, the loss of a uniform guess, the clip norm, and
the scores of the evaluate stage and of the dev sets as single points.

Usage:
    logs = read_logs(stage_dir)       # or parse_logs(train_text, eval_text)
    fig = curves_figure("pretrain", logs, references(plan, stage, summaries), title="...")
    png = figure_png(fig)
    draw_stage_curves(ctx, summary)    # in a handler: never raises, reports a warning

No TensorFlow (``runexp report`` uses this module too); matplotlib's Agg canvas is used
directly (no pyplot, so no global state and no display).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
from typing import Mapping, Optional, Sequence

from runexp.compiler.kinds import read_summary
from runexp.compiler.specs import PreprocessSpec
from runexp.compiler.specs.task_kinds import ACCURACY
from runexp.runtime import cluster, log_reader
from runexp.runtime.log_reader import EVAL_LOG, TRAIN_LOG

CURVES_FILE = "curves.png"

# Size and resolution of the PNG: 1500 x 820 pixels for the six panels of a pretrain stage,
# 1200 x 740 for the four of a finetune stage.
_INCHES = {6: (15.0, 8.2), 4: (12.0, 7.4)}
_DPI = 100
# A panel switches to a log scale when its values span this factor or more.
_LOG_SCALE_SPAN = 20.0

_TRAIN_COLOR, _EVAL_COLOR = "#1f77b4", "#d62728"
_REF_COLORS = ("#555555", "#2ca02c", "#9467bd", "#8c564b")


@dataclasses.dataclass(frozen=True)
class Logs:
    train: list  # metric records of train_log.jsonl, in step order
    evals: list  # records of eval_log.jsonl
    events: list  # records of train_log.jsonl with an "event" key

    @property
    def last_step(self) -> int:
        steps = [r.get("step", 0) for r in self.train + self.evals + self.events]
        return max(steps) if steps else 0

    def __bool__(self) -> bool:
        return bool(self.train or self.evals)


@dataclasses.dataclass(frozen=True)
class Reference:
    """A value to read the curves against: a horizontal line, or one point at ``step``."""

    label: str
    value: float
    step: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    series: tuple  # (source "train" | "eval", key, legend label)
    refs_key: str = ""  # which references apply
    log_ok: bool = True  # may switch to a log scale
    zero_based: bool = False  # the y axis starts at 0
    percent: bool = False  # an accuracy in [0, 1]


PRETRAIN_PANELS = (
    Panel("Loss (MLM + NSP)", "loss", (("train", "loss", "train"), ("eval", "loss", "held-out")),
          "loss"),
    Panel("Masked-LM accuracy", "accuracy",
          (("train", "mlm_accuracy", "train"), ("eval", "mlm_accuracy", "held-out")),
          "mlm_accuracy", log_ok=False, percent=True),
    Panel("Next-sentence accuracy", "accuracy",
          (("train", "nsp_accuracy", "train"), ("eval", "nsp_accuracy", "held-out")),
          "nsp_accuracy", log_ok=False, percent=True),
    Panel("Learning rate", "learning rate", (("train", "learning_rate", "schedule"),),
          log_ok=False, zero_based=True),
    Panel("Throughput", "examples / s", (("train", "examples_per_second", "per log window"),),
          log_ok=False, zero_based=True),
    Panel("Gradient norm (before clipping)", "global norm",
          (("train", "grad_norm", "train"),), "grad_norm"),
)

FINETUNE_PANELS = (
    Panel("Loss", "cross-entropy", (("train", "loss", "train"), ("eval", "loss", "held-out")),
          "loss"),
    Panel("Accuracy", "accuracy",
          (("train", "accuracy", "train"), ("eval", "accuracy", "held-out")), "accuracy",
          log_ok=False, percent=True),
    Panel("Learning rate", "learning rate", (("train", "learning_rate", "schedule"),),
          log_ok=False, zero_based=True),
    Panel("Throughput", "examples / s", (("train", "examples_per_second", "per log window"),),
          log_ok=False, zero_based=True),
)

PANELS = {"pretrain": PRETRAIN_PANELS, "finetune": FINETUNE_PANELS}
_EVENT_LABELS = {"deadline_stop": "stopped at the wall-time budget"}


def logs_of(train_src, eval_src, limit: int = log_reader.CURVE_POINTS) -> Logs:
    """The logs of two log_reader sources (None: no such log): each log's events, and at
    most ``limit`` (+ the last) of its metrics records evenly through it (log_reader.sample),
    so a million-step log draws about as fast, and in as little memory, as a short one."""
    by_step = lambda r: r.get("step", 0)  # noqa: E731
    train, events = log_reader.sample(train_src, limit)
    evals, _ = log_reader.sample(eval_src, limit)
    return Logs(train=sorted(train, key=by_step), evals=sorted(evals, key=by_step),
                events=events)


def parse_logs(train_text: Optional[str], eval_text: Optional[str]) -> Logs:
    """The logs of two jsonl texts (None: no such log)."""
    text = lambda t: log_reader.TextSource(t) if t else None  # noqa: E731
    return logs_of(text(train_text), text(eval_text))


def read_logs(stage_dir: str) -> Logs:
    """The logs of a stage directory (local or gs://)."""
    return logs_of(log_reader.source(log_reader.log_path(stage_dir, TRAIN_LOG)),
                   log_reader.source(log_reader.log_path(stage_dir, EVAL_LOG)))


# --- references -----------------------------------------------------------------------------

def _evaluate_of(plan, stage):
    """The evaluate stage that scores ``stage``'s checkpoints, if the plan has one."""
    for s in plan.stages:
        if s.kind == "evaluate" and s.inputs.get("checkpoint_dir") == stage.output_dir:
            return s
    return None


def nsp_chance(plan) -> Optional[float]:
    """Accuracy of always guessing the more frequent NSP label: max(p, 1 - p) of the
    preprocess stages' ``random_next_prob``, when they all use the NSP objective and agree."""
    probs = set()
    for s in plan.stages:
        if s.kind != "preprocess":
            continue
        spec = PreprocessSpec.from_stage(s)
        if spec.pair_objective != "nsp":
            return None
        probs.add(float(spec.random_next_prob))
    if len(probs) != 1:
        return None
    p = probs.pop()
    return max(p, 1.0 - p)


def references(plan, stage, summaries: Mapping[str, dict]) -> dict[str, list[Reference]]:
    """Panel key -> references, from the plan and the MANIFEST summaries known so far
    (stage id -> summary; stages not done are simply absent)."""
    refs: dict[str, list[Reference]] = {}
    add = lambda key, ref: refs.setdefault(key, []).append(ref)  # noqa: E731
    vocab = (stage.params.get("model") or {}).get("vocab_size")
    own = summaries.get(stage.id) or {}
    if stage.kind == "pretrain":
        if vocab:
            add("loss", Reference(f"uniform guess: ln {vocab} + ln 2",
                                  math.log(vocab) + math.log(2)))
        chance = nsp_chance(plan)
        if chance is not None:
            add("nsp_accuracy", Reference("chance (more frequent label)", chance))
        clip = stage.params.get("clip_norm")
        if clip:
            add("grad_norm", Reference("clip norm", float(clip)))
        ev = _evaluate_of(plan, stage)
        found = summaries.get(ev.id) if ev is not None else None
        scores = read_summary("evaluate", found) if found else None
        if scores:
            step = scores.step
            if scores.majority_token_accuracy is not None:
                add("mlm_accuracy", Reference("most frequent token (baseline)",
                                              scores.majority_token_accuracy))
            if scores.mlm_accuracy is not None and step is not None:
                add("mlm_accuracy", Reference(f"{ev.id} stage", scores.mlm_accuracy, step))
            if scores.nsp_accuracy is not None and step is not None:
                add("nsp_accuracy", Reference(f"{ev.id} stage", scores.nsp_accuracy, step))
    elif stage.kind == "finetune":
        run = read_summary("finetune", own)
        labels = run.num_labels
        if labels and labels > 1:
            add("loss", Reference(f"uniform guess: ln {labels}", math.log(labels)))
        sets, step = run.dev_scores(), run.step
        for name, scores in sets.items():
            suffix = "" if len(sets) == 1 else f" ({name})"
            if scores.majority_baseline is not None:
                add(ACCURACY, Reference(f"majority class{suffix}", scores.majority_baseline))
            accuracy = scores.values.get(ACCURACY)
            if accuracy is not None and step is not None:
                add(ACCURACY, Reference("dev accuracy" if name == "dev" else f"dev set {name}",
                                        accuracy, step))
    return refs


# --- the figure -----------------------------------------------------------------------------

def _points(records: Sequence[dict], key: str) -> tuple[list, list]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v) and "step" in r:
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def curves_figure(kind: str, logs: Logs, refs: Optional[Mapping[str, list]] = None,
                  title: str = "", total_steps: Optional[int] = None):
    """The figure of a ``kind`` ("pretrain" or "finetune") stage's logs: one panel per
    quantity that was logged, all on the same step axis (0 .. ``total_steps`` when given).
    Returns a matplotlib Figure (panels in ``fig.axes``, each with a ``runexp_key``)."""
    refs = refs or {}
    sources = {"train": logs.train, "eval": logs.evals}
    panels = [p for p in PANELS[kind]
              if any(_points(sources[src], key)[0] for src, key, _ in p.series)]
    if not panels:
        raise ValueError(f"nothing to draw: no metrics in the {kind} logs")
    fig, axes, cols = _grid(len(panels), title)
    right = max(total_steps or 0, logs.last_step, 1)
    for n, (ax, panel) in enumerate(zip(axes, panels)):
        ax.runexp_key = panel.series[0][1]
        own_refs = refs.get(panel.refs_key, []) if panel.refs_key else []
        values = _draw_series(ax, panel, sources) + _draw_references(ax, panel, own_refs)
        _draw_events(ax, logs.events, in_legend=n == 0)
        _scale(ax, panel, values)
        _decorate(ax, panel, right)
    _label_bottom_row(axes, len(panels), cols)
    return fig


def _grid(count: int, title: str):
    """An empty figure for ``count`` panels: 3 columns for more than 4 panels, else 2, as
    many rows as they need. Returns the figure, its axes (flat, row by row) and the number
    of columns."""
    from matplotlib.figure import Figure

    cols = 3 if count > 4 else 2
    rows = math.ceil(count / cols)
    width, height = _INCHES[6 if cols == 3 else 4]
    fig = Figure(figsize=(width, height * rows / 2), dpi=_DPI, layout="constrained")
    if title:
        fig.suptitle(title, fontsize=14, fontweight="bold")
    axes = fig.subplots(rows, cols, sharex=True, squeeze=False).ravel()
    return fig, axes, cols


def _draw_series(ax, panel: Panel, sources: Mapping[str, list]) -> list:
    """The panel's logged curves: train solid (with markers while it has 30 points or
    fewer), held-out dashed with markers. Returns the values drawn."""
    values = []
    for src, key, label in panel.series:
        xs, ys = _points(sources[src], key)
        if not xs:
            continue
        values += ys
        if src == "train":
            ax.plot(xs, ys, color=_TRAIN_COLOR, lw=1.6, label=label,
                    marker="o" if len(xs) <= 30 else None, ms=3)
        else:
            ax.plot(xs, ys, color=_EVAL_COLOR, lw=1.4, ls="--", marker="o", ms=5, label=label)
    return values


def _draw_references(ax, panel: Panel, refs: Sequence[Reference]) -> list:
    """Each reference as a dotted horizontal line, or a star at its step, with its value in
    the legend. Returns their values (the y axis must show them)."""
    for i, ref in enumerate(refs):
        color = _REF_COLORS[i % len(_REF_COLORS)]
        label = f"{ref.label}: {_fmt(ref.value, panel.percent)}"
        if ref.step is None:
            ax.axhline(ref.value, color=color, lw=1.2, ls=":", label=label)
        else:
            ax.plot([ref.step], [ref.value], ls="none", marker="*", ms=13, color=color,
                    markeredgecolor="black", markeredgewidth=0.5, label=label)
    return [ref.value for ref in refs]


def _draw_events(ax, events: Sequence[dict], in_legend: bool) -> None:
    """A vertical line at each event's step; every panel has them, so only the first names
    them in its legend (each name once)."""
    seen = set()
    for event in events:
        name = _EVENT_LABELS.get(event.get("event"), str(event.get("event")))
        ax.axvline(event.get("step", 0), color="#ff7f0e", lw=1.2, ls="-.",
                   label=name if in_legend and name not in seen else "_nolegend_")
        seen.add(name)


def _decorate(ax, panel: Panel, right: int) -> None:
    """Title, labels, grid, the shared step range, tick format and (when it says more than
    the title) the legend."""
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    ax.set_title(panel.title, fontsize=12)
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_xlim(0, right * 1.02)
    if panel.percent:
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=None))
    elif panel.ylabel == "learning rate":
        ax.yaxis.set_major_formatter(FuncFormatter(_sci))
    handles, _ = ax.get_legend_handles_labels()
    if len(handles) > 1 or panel.refs_key:
        ax.legend(fontsize=8.5, loc="best", framealpha=0.85)


def _label_bottom_row(axes, count: int, cols: int) -> None:
    """Hides the grid's unused axes and labels the step axis of each panel with no panel
    below it (the axis is shared, so the others' tick labels are hidden)."""
    for ax in axes[count:]:
        ax.set_visible(False)
    for i, ax in enumerate(axes[:count]):
        if i + cols >= count:
            ax.set_xlabel("step")
            ax.tick_params(labelbottom=True)


def _scale(ax, panel: Panel, values: list) -> None:
    positive = [v for v in values if v > 0]
    if panel.log_ok and positive and len(positive) == len(values) and \
            max(positive) / min(positive) >= _LOG_SCALE_SPAN:
        ax.set_yscale("log")
        return
    if panel.zero_based and values:
        ax.set_ylim(0, max(values) * 1.08 or 1.0)
    elif panel.percent and values:
        lo, hi = min(values), max(values)
        pad = max(0.02, (hi - lo) * 0.12)
        ax.set_ylim(max(0.0, lo - pad), min(1.0, hi + pad))


def _sci(value: float, _pos=None) -> str:
    """1e-3, 2.5e-4, 0: a learning rate's tick label, without an offset text."""
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _fmt(value: float, percent: bool) -> str:
    return f"{value:.1%}" if percent else f"{value:.3g}"


def figure_png(fig) -> bytes:
    """The figure as PNG bytes (Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return buf.getvalue()


def stage_title(plan, stage, logs: Logs) -> str:
    total = stage.params.get("train_steps")
    where = f"step {logs.last_step:,}" + (f" of {total:,}" if total else "")
    return f"{plan.experiment} · {stage.id}: {where}"


def draw_stage_curves(ctx, summary: Optional[dict] = None, sync: bool = False) -> Optional[str]:
    """Draws ``curves.png`` into a training handler's ``ctx.work_dir`` from its logs, with
    the references known then (``summary``: the handler's own, if it has one yet); with
    ``sync`` (a stop: the executor will not sync) makes it durable with ``ctx.sync()``.
    Never raises: training outcomes must not depend on a plot; a failure is a warning line.
    Returns the PNG's path (None when nothing was drawn)."""
    try:
        if not cluster.is_chief():  # other workers train in private dirs nobody reads
            return None
        stage = ctx.stage
        logs = read_logs(ctx.work_dir)
        if not logs:
            return None
        summaries = {stage.id: summary} if summary else {}
        fig = curves_figure(stage.kind, logs, references(ctx.plan, stage, summaries),
                            title=stage_title(ctx.plan, stage, logs),
                            total_steps=stage.params.get("train_steps"))
        png = figure_png(fig)
        path = os.path.join(ctx.work_dir, CURVES_FILE)
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(png)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        ctx.progress(f"training curves: {CURVES_FILE}")
        if sync:
            ctx.sync()
        return path
    except Exception as e:  # noqa: BLE001 - a plot never fails a training stage
        try:
            ctx.progress(f"warning: the training curves were not drawn or saved "
                         f"({type(e).__name__}: {e}); the stage is not affected")
        except Exception:  # noqa: BLE001
            pass
        return None
