"""The report's ablation section: the pretrain stages of an ablation's points compared
(issue 27: "held-out masked-LM accuracy after the same number of instances seen is equal
within seed noise").

For each pretrain stage the ablation plans once per point (``pretrain.packingTrue.seed2``):
- one figure: held-out masked-LM accuracy and loss (``eval_log.jsonl``, written every
  ``train.eval_every`` steps) against the instances seen, step x the stage's instances a
  step. The points are grouped by every key but the seed-like ones (a key whose name ends in
  ``seed``: ``train.seed``, ``RANDOM_SEED``); a group is drawn as the mean of its seeds, a
  band from their minimum to their maximum and a thin line per seed;
- a table: each group at the last evaluation every stage drawn has reached, mean ± sample
  standard deviation over its seeds, and its difference from the first group with a verdict
  (``within seed noise``: within twice the seeds' pooled standard deviation);
- the evaluate stages' final scores, grouped and compared the same way, when there are some.

Instances a step (TrainSpec, compiler/packing.py): ``batch_size`` unpacked and with
``train.batch_counts = 'instances'``; with ``'rows'`` the batch's rows x the packing factor
the preprocess stage measured (its MANIFEST summary, ``train.packing.factor``). When that
factor is not known the axis counts rows and says so.

A stage's point is read from the plan's ``ablation`` record (compiler/ablation.py: its keys
and their short names, the points' values, and which keys change which stage): each stage id
is made again as the compiler makes it and looked up. No TensorFlow.

Usage:
    html = section_ablation(report)        # "" for an experiment without an ablation
    for base, png in ablation_figures(report): ...
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from runexp.compiler.ablation import _value_name
from runexp.compiler.specs import TrainSpec
from runexp.compiler.sweep import value_text
from runexp.runtime.report import curves
from runexp.runtime.report.collect import Report, StageReport
from runexp.runtime.report.format import esc, img
from runexp.runtime.report.ablation_figure import METRICS, figure
from runexp.runtime.report.seed_noise import NOISE_STDS, Stat, stat, verdict

ABLATION_FILE = "ablation.png"  # the figure's name (ablation.BASE.png for a second base)
# The evaluate stages' scores compared in the second table (MANIFEST summary keys).
_EVALUATE_METRICS = (("mlm_accuracy", "MLM accuracy", True), ("mlm_loss", "MLM loss", False),
                     ("nsp_accuracy", "NSP accuracy", True))


def is_seed(key: str) -> bool:
    """A seed-like ablation key: its name ends in 'seed' (train.seed, RANDOM_SEED)."""
    return key.lower().endswith("seed")


def stage_points(plan) -> dict[str, tuple[str, dict]]:
    """Stage id -> (the id it has outside the ablation, {key: value} of the keys that change
    it), for every stage the plan's ablation plans once per point (the ids made as
    compiler/ablation.py's ``merge`` makes them)."""
    info = getattr(plan, "ablation", None) or {}
    shorts, points = info.get("keys") or {}, info.get("points") or {}
    ids = {s.id for s in plan.stages}
    out: dict[str, tuple[str, dict]] = {}
    for base, changing in (info.get("per_point") or {}).items():
        for values in points.values():
            if not all(k in values and k in shorts for k in changing):
                continue
            sid = base + "." + ".".join(f"{shorts[k]}{_value_name(values[k])}" for k in changing)
            if sid in ids and sid not in out:
                out[sid] = (base, {k: values[k] for k in changing})
    return out


# --- what is compared -----------------------------------------------------------------------

@dataclasses.dataclass
class Run:
    """One point's stage: its values, its instances a step and its held-out evaluations."""

    sr: StageReport
    values: dict  # key -> value, the keys that change the stage
    per_step: Optional[float] = None  # instances a step (None: not known, see unit)
    per_step_note: str = ""  # how per_step was found
    rows_only: bool = False  # x counts rows: the packing factor is not known
    evals: list = dataclasses.field(default_factory=list)  # eval_log records, by step

    def xs(self, key: str) -> list[tuple[float, float]]:
        """(instances seen, value) of ``key`` at each evaluation."""
        out = []
        for rec in self.evals:
            v, step = rec.get(key), rec.get("step")
            if isinstance(v, (int, float)) and isinstance(step, (int, float)) \
                    and math.isfinite(v):
                out.append((step * (self.per_step or 1.0), float(v)))
        return out

    def seed_text(self) -> str:
        seeds = [f"{k.rpartition('.')[2]} {value_text(v)}" for k, v in self.values.items()
                 if is_seed(k)]
        return ", ".join(seeds) or self.sr.stage.id


@dataclasses.dataclass
class Group:
    """The points that differ only in seed-like keys."""

    values: dict  # the non-seed keys' values
    runs: list
    name: str = ""  # 'packing=True'
    label: str = ""  # 'packing=True (3 seeds)'


def _instances_per_step(r: Report, sr: StageReport) -> tuple[Optional[float], str, bool]:
    """(instances a step, how it was found, counts rows only) of a pretrain stage."""
    t = TrainSpec.from_stage(sr.stage)
    if not t.packing or t.batch_counts == "instances":
        how = f"{t.batch_size} (batch_size" + ("; packed rows, train.batch_counts = "
                                               "'instances')" if t.packing else ")")
        return float(t.batch_size), how, False
    for dep in sr.stage.deps:
        pre = r.get(dep)
        if pre is None or pre.stage.kind != "preprocess" or not pre.done:
            continue
        train = pre.outputs.train
        factor = train.packing.factor if train is not None and train.packing else None
        if isinstance(factor, (int, float)) and factor > 0:
            return (t.batch_size * float(factor),
                    f"{t.batch_size} rows x {float(factor):.4g} instances a row (measured by "
                    f"{pre.stage.id})", False)
    return (float(t.batch_size), f"{t.batch_size} rows (the packing factor is not known: "
                                 "its preprocess stage is not done)", True)


def _runs(r: Report, kind: str) -> dict[str, list[tuple[StageReport, dict]]]:
    """Base id -> [(stage, its values)] of the ``kind`` stages planned once per point."""
    out: dict[str, list] = {}
    points = stage_points(r.plan)
    for sr in r.stages:
        if sr.stage.kind == kind and sr.stage.id in points:
            base, values = points[sr.stage.id]
            out.setdefault(base, []).append((sr, values))
    return out


def _ident(values: dict) -> tuple:
    return tuple((k, value_text(v)) for k, v in values.items() if not is_seed(k))


def _group(items: list, keys: dict, planned: Optional[list] = None) -> list[Group]:
    """Items (each with ``.values``) grouped by their non-seed keys' values, in plan order;
    labelled 'packing=True (3 seeds)', or 'packing=True (2 of 3 seeds)' when ``planned``
    (every point's values) holds more of the group."""
    groups: dict[tuple, Group] = {}
    for item in items:
        values = {k: v for k, v in item.values.items() if not is_seed(k)}
        groups.setdefault(_ident(values), Group(values, [])).runs.append(item)
    for ident, g in groups.items():
        g.name = ", ".join(f"{keys.get(k, k)}={value_text(v)}"
                           for k, v in g.values.items()) or "every point"
        n = len(g.runs)
        total = sum(_ident(v) == ident for v in planned) if planned else n
        g.label = (f"{g.name} ({n} seed{'s' if n != 1 else ''})" if total <= n
                   else f"{g.name} ({n} of {total} seeds)")
    return list(groups.values())


def _at(points: list[tuple[float, float]], x: float) -> Optional[float]:
    """The value at ``x``: the evaluation there, or between the two around it (linear)."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            if math.isclose(x, x0, rel_tol=1e-9):
                return y0
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    if points and math.isclose(points[-1][0], x, rel_tol=1e-9):
        return points[-1][1]
    return None


def common_x(runs: list) -> Optional[float]:
    """The last evaluation every run has reached: the least of their last instances seen."""
    ends = [r.xs("mlm_accuracy")[-1][0] for r in runs if r.xs("mlm_accuracy")]
    return min(ends) if ends and len(ends) == len(runs) else None


# --- the section ----------------------------------------------------------------------------

@dataclasses.dataclass
class Comparison:
    """One base stage's comparison: what the figure and the table show."""

    base: str
    groups: list  # Group of Run, the runs with held-out evaluations
    missing: list  # (stage id, why) of the runs without
    at: Optional[float]  # the instances seen the table compares at
    png: Optional[bytes] = None
    error: str = ""


def comparisons(r: Report, draw: bool = True) -> list[Comparison]:
    """Every pretrain stage planned once per point, compared (the figure drawn with
    ``draw``)."""
    keys = dict((r.plan.ablation or {}).get("keys") or {})
    out = []
    for base, items in _runs(r, "pretrain").items():
        runs, missing = [], []
        for sr, values in items:
            per_step, how, rows_only = _instances_per_step(r, sr)
            logs = sr.logs if sr.logs is not None else curves.read_logs(sr.dir)
            run = Run(sr, values, per_step, how, rows_only, list(logs.evals))
            if run.xs("mlm_accuracy"):
                runs.append(run)
            else:
                why = ("not started" if sr.status == "not started" else
                       "no held-out evaluation logged yet"
                       + ("" if sr.stage.params.get("eval_every") else
                          " (train.eval_every is 0: it logs none)"))
                missing.append((sr.stage.id, why))
        groups = _group(runs, keys, [values for _, values in items])
        c = Comparison(base, groups, missing, common_x(runs))
        if draw and runs:
            experiment = r.plan.experiment
            varied = ", ".join(keys.get(k, k) for k in (groups[0].values if groups else {}))
            title = (f"{experiment} · {base}" + (f" by {varied}" if varied else "")
                     + ": held-out masked LM against instances seen")
            try:
                c.png = curves.figure_png(figure(title, groups, c.at))
            except Exception as e:  # noqa: BLE001 - the table is shown without it
                c.error = f"{type(e).__name__}: {e}"
        out.append(c)
    return out


def ablation_figures(r: Report) -> list[tuple[str, bytes]]:
    """(file name, PNG) of each comparison drawn: ``ablation.png``, then
    ``ablation.BASE.png`` for any further pretrain stage."""
    out = []
    for i, c in enumerate(comparisons(r)):
        if c.png:
            out.append((ABLATION_FILE if i == 0 else f"ablation.{c.base}.png", c.png))
    return out


def _num(v: float, percent: bool) -> str:
    return f"{v:.2%}" if percent else f"{v:.4f}"


def _spread(s: Stat, percent: bool) -> str:
    """'12.34% ± 0.56 (n=3)', '6.1234 ± 0.0123 (n=3)' (std in points for a percentage)."""
    if s.std is None:
        return f"{_num(s.mean, percent)} (n={s.n})"
    std = f"{s.std * 100:.2f}" if percent else f"{s.std:.4f}"
    return f"{_num(s.mean, percent)} ± {std} (n={s.n})"


def _diff(first: Optional[Stat], s: Optional[Stat], percent: bool) -> tuple[str, str]:
    """(difference cell, verdict cell) of ``s`` against the first group's."""
    if first is None or s is None:
        return "—", "—"
    diff, pooled, word = verdict(first, s)
    text = f"{diff * 100:+.2f} points" if percent else f"{diff:+.4f}"
    if pooled is not None:
        limit = f"{NOISE_STDS * pooled * 100:.2f} points" if percent \
            else f"{NOISE_STDS * pooled:.4f}"
        text += f" (limit ±{limit})"
    cls = {"within seed noise": "good", "differs": "bad"}.get(word, "muted")
    return esc(text), f"<span class='{cls}'>{esc(word)}</span>"


def _stats_at(runs: list, key: str, x: Optional[float]) -> Optional[Stat]:
    if x is None:
        return None
    values = [v for v in (_at(r.xs(key), x) for r in runs) if v is not None]
    return stat(values)


def _table(c: Comparison) -> str:
    head = ("<tr><th>group</th><th>seeds</th>"
            + "".join(f"<th>{esc(name.replace('Held-out masked-LM', 'held-out MLM'))}: "
                      f"mean ± std</th><th>vs {esc(c.groups[0].name)}</th>"
                      "<th></th>" for _, name, _, _ in METRICS) + "</tr>")
    rows = []
    firsts = {key: _stats_at(c.groups[0].runs, key, c.at) for key, *_ in METRICS}
    for i, g in enumerate(c.groups):
        cells = []
        for key, _, _, percent in METRICS:
            s = _stats_at(g.runs, key, c.at)
            cells.append(f"<td class='num'><b>{esc(_spread(s, percent)) if s else '—'}</b></td>")
            if i == 0:
                cells.append("<td class='muted'>reference</td><td></td>")
            else:
                d, v = _diff(firsts[key], s, percent)
                cells.append(f"<td class='num'>{d}</td><td>{v}</td>")
        seeds = ", ".join(esc(run.seed_text() + ("" if run.sr.done else " (not finished)"))
                          for run in g.runs)
        rows.append(f"<tr><td>{esc(g.label)}</td><td class='small'>{seeds}</td>"
                    + "".join(cells) + "</tr>")
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _notes(c: Comparison) -> str:
    runs = [run for g in c.groups for run in g.runs]
    exact, between = set(), []
    for run in runs:
        steps = [rec["step"] for rec in run.evals if isinstance(rec.get("step"), (int, float))
                 and math.isclose(rec["step"] * (run.per_step or 1.0), c.at or -1.0)]
        exact.update(steps)
        if not steps:
            between.append(run.sr.stage.id)
    unit = "rows" if any(r.rows_only for r in runs) else "instances"
    at = (f"{c.at:,.0f} {unit} seen"
          + (f" (step {', '.join(f'{s:,}' for s in sorted(exact))})" if exact else "")
          if c.at is not None else "—")
    unfinished = [run.sr.stage.id for run in runs if not run.sr.done]
    per_step = list(dict.fromkeys(f"{g.name}: {run.per_step_note}"
                                  for g in c.groups for run in g.runs))
    notes = [f"Compared at the last held-out evaluation every stage drawn has reached: {at}"
             + (f"; read between the two evaluations around it for {', '.join(between)}, "
                "which evaluated elsewhere" if between else "") + "."
             + (f" Not finished, compared so far: {', '.join(unfinished)}." if unfinished
                else ""),
             f"Verdict: a group is <b>within seed noise</b> of the first when the difference "
             f"of their means is at most {NOISE_STDS:g} × their pooled sample standard "
             "deviation (the spread of one seed's result, pooled over both groups' seeds, "
             "n − 1 each); otherwise it <b>differs</b>. Standard deviations are sample ones "
             "(n − 1); for an accuracy they are in percentage points.",
             "Instances a step: " + esc("; ".join(per_step)) + "."]
    return "".join(f"<p class='note'>{n}</p>" for n in notes) + _notes_missing(c)


def _evaluate_table(r: Report) -> str:
    """The evaluate stages' final scores, grouped and compared as the curves are."""
    keys = dict((r.plan.ablation or {}).get("keys") or {})
    parts = []
    for base, items in _runs(r, "evaluate").items():
        done = [Run(sr, values) for sr, values in items if sr.done]
        if not done:
            parts.append(f"<p class='muted'>{esc(base)}: no evaluate stage is done yet.</p>")
            continue
        groups = _group(done, keys)
        head = ("<tr><th>group</th>" + "".join(
            f"<th>{esc(name)}: mean ± std</th><th>vs {esc(groups[0].name)}</th><th></th>"
            for _, name, _ in _EVALUATE_METRICS) + "</tr>")
        firsts = {k: stat([run.sr.summary[k] for run in groups[0].runs
                           if isinstance(run.sr.summary.get(k), (int, float))])
                  for k, _, _ in _EVALUATE_METRICS}
        rows = []
        for i, g in enumerate(groups):
            cells = []
            for k, _, percent in _EVALUATE_METRICS:
                s = stat([run.sr.summary[k] for run in g.runs
                          if isinstance(run.sr.summary.get(k), (int, float))])
                cells.append(f"<td class='num'><b>{esc(_spread(s, percent)) if s else '—'}"
                             "</b></td>")
                if i == 0:
                    cells.append("<td class='muted'>reference</td><td></td>")
                else:
                    d, v = _diff(firsts[k], s, percent)
                    cells.append(f"<td class='num'>{d}</td><td>{v}</td>")
            rows.append(f"<tr><td>{esc(g.label)}</td>{''.join(cells)}</tr>")
        n_all = len(items)
        parts.append(f"<h3>{esc(base)}: the final checkpoints scored</h3>"
                     f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
                     f"<p class='note'>{len(done)} of {n_all} {esc(base)} stages done; each "
                     "scores its pretrain stage's last checkpoint on the held-out split "
                     "(MANIFEST summary). Same verdict rule as above.</p>")
    return "".join(parts)


def section_ablation(r: Report, reader=None) -> str:
    """The section's HTML; "" when the experiment has no ablation. ``reader`` is unused
    (the logs come with the Report), taken for the same call as the other sections."""
    info = r.plan.ablation or {}
    if not info:
        return ""
    keys = info.get("keys") or {}
    grid = " × ".join(f"<code>{esc(k)}</code>" for k in keys)
    head = (f"<p>The experiment's ablation ({esc(info.get('where', ''))}): {grid}, "
            f"{len(info.get('points') or {})} points. Seed-like keys (a name ending in "
            "<code>seed</code>) are the repeats of a group; the others tell the groups "
            "apart.</p>")
    parts = [head]
    try:
        cs = comparisons(r)
    except Exception as e:  # noqa: BLE001 - a plan this section cannot read: said, not raised
        return head + (f"<p class='muted'>The points could not be compared: "
                       f"{esc(type(e).__name__)}: {esc(e)}.</p>")
    if not cs:
        parts.append("<p class='muted'>The ablation plans no pretrain stage per point: "
                     "nothing to compare here.</p>")
    for i, c in enumerate(cs):
        if len(cs) > 1:
            parts.append(f"<h3>{esc(c.base)}</h3>")
        if not c.groups:
            parts.append(f"<p class='muted'>No held-out evaluation of any {esc(c.base)} stage "
                         "yet.</p>" + _notes_missing(c))
            continue
        name = ABLATION_FILE if i == 0 else f"ablation.{c.base}.png"
        if c.png:
            parts.append(f"<figure>{img(c.png, name)}<figcaption>Held-out masked-LM accuracy "
                         f"and loss (<code>{esc(curves.EVAL_LOG)}</code>, every "
                         "<code>train.eval_every</code> steps) against the instances seen. "
                         "Thick: the mean of a group's seeds at the evaluations they all "
                         "made; band: their minimum to maximum; thin: each seed."
                         "</figcaption></figure>")
        elif c.error:
            parts.append(f"<p class='muted'>The figure could not be drawn: {esc(c.error)}.</p>")
        parts.append(_table(c) + _notes(c))
    parts.append(_evaluate_table(r))
    return "".join(parts)


def _notes_missing(c: Comparison) -> str:
    if not c.missing:
        return ""
    return ("<p class='muted'>Not drawn: "
            + esc("; ".join(f"{sid} ({why})" for sid, why in c.missing))
            + ".</p>")
