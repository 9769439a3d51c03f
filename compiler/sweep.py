"""Fine-tuning sweeps: `finetune.sweep`'s grid expanded into one finetune stage per point,
then the task's sweep stage, which scores them together and names the selected point.

    finetune.sweep = {'learning_rate': [5e-5, 3e-5, 2e-5], 'seed': [1, 2]}

plans `finetune.TASK.lr5e-5.s1`, `finetune.TASK.lr5e-5.s2`, ... (the point in the stage id:
each swept setting's short name and value, the seed last), all on the one vocab, preprocess
and pretrain (their fingerprints do not depend on the fine-tune's settings, so every point
reads the same stages), then `sweep.TASK`. A point's stage is an ordinary finetune stage: its
fingerprint is its own settings', so adding a value to the grid plans only the new points
anew (and the sweep stage and the export, whose choice may change); `--only`, `--until`,
resume and `runexp status` work per point as for any stage.

Which settings can be swept is derived from FinetuneSpec (compiler/specs/finetune.py): its
numeric settings bound on `finetune` itself. The selection is declared in SweepSpec
(compiler/specs/sweep.py): the highest mean dev score over the seeds, exported at its best
seed, or `finetune.export_point`.

No TensorFlow, no seqio.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

from runexp.compiler.errors import did_you_mean
from runexp.compiler.plan import Plan, Stage
from runexp.compiler.specs import ClassificationSpec, FinetuneSpec, SweepSpec
from runexp.compiler.specs.base import Setting
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.compiler.estimates import _duration

# A swept setting's short name in a point's name (its gin name when not listed here).
SHORT_NAMES = {"learning_rate": "lr", "batch_size": "bs", "seed": "s", "steps": "steps",
               "warmup_steps": "warmup", "weight_decay": "wd", "max_seq_length": "len"}
SEED = "seed"
EXAMPLE = "{'learning_rate': [5e-5, 3e-5, 2e-5], 'seed': [1, 2]}"


def sweepable() -> dict[str, Setting]:
    """gin name -> setting, for every setting a sweep may vary: FinetuneSpec's numbers bound
    on `finetune` itself (not the task's fields, not the model, not the run-time values)."""
    return {s.gin: s for s in FinetuneSpec.settings()
            if s.settable and s.planned and s.param.type in ("int", "float")}


@dataclasses.dataclass(frozen=True)
class Grid:
    """Attributes:
      axes: (gin name, stage param, values) per swept setting, the seed last.
      points: point name -> {stage param: value}, in grid order (the last axis fastest).
      where: the binding's provenance, for each point's params.
    """

    axes: tuple
    points: dict
    where: str

    @property
    def varied(self) -> list[str]:
        """The swept stage params besides the seed."""
        return [param for gin, param, _ in self.axes if gin != SEED]

    def describe(self) -> str:
        """'learning_rate 3 x seed 2 = 6 points'."""
        sizes = " x ".join(f"{gin} {len(values)}" for gin, _, values in self.axes)
        n = len(self.points)
        return f"{sizes} = {n} point{'s' if n != 1 else ''}"


def value_text(value) -> str:
    """A value as a point's name shows it: 3e-05 -> 3e-5, 0.0001 -> 1e-4, 0.01 -> 0.01,
    32 -> 32 (six significant digits)."""
    if isinstance(value, float):
        if value and (abs(value) < 1e-2 or abs(value) >= 1e6):
            mantissa, exponent = f"{value:.5e}".split("e")
            return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return f"{value:.6g}"
    return str(value)


def point_name(settings: list[tuple[str, object]]) -> str:
    """'lr3e-5.bs32.s1' of [(gin name, value), ...]."""
    return ".".join(f"{SHORT_NAMES.get(gin, gin)}{value_text(v)}" for gin, v in settings)


def read_grid(ctx: PlanContext) -> Optional[Grid]:
    """finetune.sweep checked and expanded; None when it is unset, or after reporting why it
    cannot be (each problem once, at the binding's file and line)."""
    raw = ctx.r.get("finetune", "sweep")
    if raw is None:
        for param in ("select_metric", "export_point"):
            if ctx.r.get("finetune", param) is not None:
                ctx.c.error(f"finetune.{param} is set, but finetune.sweep is not: there is no "
                            "sweep to choose from", ctx.loc("finetune", param),
                            hint=f"set finetune.sweep (e.g. {EXAMPLE}), or unset "
                                 f"finetune.{param}")
        return None
    where = ctx.loc("finetune", "sweep")
    allowed = sweepable()
    if not raw:
        ctx.c.error("finetune.sweep is empty: a sweep needs at least one setting to vary",
                    where, hint=f"e.g. finetune.sweep = {EXAMPLE}, or unset it")
        return None
    axes, ok = [], True
    for key, values in raw.items():
        if key not in allowed:
            ctx.c.error(f"finetune.sweep: {key!r} is not a setting a sweep can vary", where,
                        hint=(did_you_mean(str(key), allowed) or "")
                        + f" (sweepable: {', '.join(allowed)})")
            ok = False
            continue
        label = f"finetune.sweep[{key!r}]"
        if not isinstance(values, (list, tuple)) or not values:
            ctx.c.error(f"{label} must be a non-empty list of values, got {values!r}", where,
                        hint=f"e.g. {key!r}: [{values!r}]" if not isinstance(
                            values, (list, tuple)) else f"list the values of {key} to try")
            ok = False
            continue
        checked = [ctx.r.check_value(v, allowed[key].param, label, where) for v in values]
        if any(v is None for v in checked):
            ok = False
            continue
        repeated = sorted({value_text(v) for v in checked
                           if [value_text(c) for c in checked].count(value_text(v)) > 1})
        if repeated:
            ctx.c.error(f"{label} lists {', '.join(repeated)} more than once", where,
                        hint="list each value once (values a point's name shows alike, such "
                             "as 3e-5 and 3.0000001e-5, are the same point)")
            ok = False
            continue
        axes.append((key, allowed[key].name, tuple(checked)))
    if not ok:
        return None
    axes.sort(key=lambda axis: axis[0] == SEED)  # the seed last, else the order written
    points = {}
    for combo in itertools.product(*(values for _, _, values in axes)):
        name = point_name([(gin, v) for (gin, _, _), v in zip(axes, combo)])
        points[name] = {param: v for (_, param, _), v in zip(axes, combo)}
    return Grid(tuple(axes), points, ctx.r.provenance("finetune", "sweep").short())


def plan_points(ctx: PlanContext, task: str, b: StageBuilder, inputs: dict, fps: dict,
                deps: list, grid: Grid, accel) -> Optional[Stage]:
    """One finetune stage per point of ``grid`` (``b``'s params with the point's settings),
    then the task's sweep stage, which is returned; None after reporting a problem."""
    max_pos = b.params["model"]["max_position_embeddings"]
    points = []
    for name, settings in grid.points.items():
        point = StageBuilder(ctx.r)
        point.params, point.provenance = dict(b.params), dict(b.provenance)
        for param, value in settings.items():
            point.set(param, value, grid.where)
        where = ctx.loc("finetune", "sweep")
        if "batch_size" in settings:
            ctx.check_batch(settings["batch_size"], accel, f"point {name}'s fine-tune batch size",
                            where)
        length = settings.get("max_seq_length")
        if length is not None and length > max_pos:
            ctx.c.error(f"finetune.sweep: point {name}'s max_seq_length ({length}) exceeds "
                        f"max_position_embeddings ({max_pos})", where,
                        hint=f"use at most {max_pos}")
        points.append(ctx.add(f"finetune.{task}.{name}", "finetune", point, dict(inputs),
                              dict(fps), list(deps)))
    s = StageBuilder(ctx.r)
    p = s.take_spec(SweepSpec, "finetune")
    s.set("task", task, ctx.r.provenance("finetune", "task").short() if
          ctx.r.get("finetune", "task") else ctx.r.provenance("finetune", "suite").short())
    s.set("points", {name: dict(v) for name, v in grid.points.items()}, grid.where)
    s.set("varied", grid.varied, grid.where)
    s.set("rule", SweepSpec.default("rule"), "compiler/specs/sweep.py")
    metric = p["select_metric"]
    scored_by = ClassificationSpec.pick(b.params).scored_by()
    if metric is not None and metric not in scored_by:
        ctx.c.error(f"finetune.select_metric is {metric!r}, but task {task!r} is scored by "
                    f"{', '.join(scored_by)}", ctx.loc("finetune", "select_metric"),
                    hint=(did_you_mean(metric, scored_by) or "") + " (or unset it: the task "
                         "score, the mean of its metrics)")
        return None
    named = p["export_point"]
    if named is not None and named not in grid.points:
        ctx.c.error(f"finetune.export_point is {named!r}, which is not a point of the sweep "
                    f"({grid.describe()})", ctx.loc("finetune", "export_point"),
                    hint=(did_you_mean(named, grid.points) or "") + f" (the points: "
                    f"{', '.join(list(grid.points)[:6])}"
                    + (", ..." if len(grid.points) > 6 else "") + "; or unset it to export "
                    "the selected point)")
        return None
    return ctx.add(f"sweep.{task}", "sweep", s,
                   {"finetune_dirs": {n: st.output_dir for n, st in zip(grid.points, points)}},
                   {n: st.fingerprint for n, st in zip(grid.points, points)},
                   [st.id for st in points])


def export_source(ctx: PlanContext, sweep: Stage) -> tuple[dict, dict, list, Stage]:
    """What the export of a sweep reads: (inputs, fingerprints, deps, a point's stage, for
    the model). The named point (finetune.export_point) alone; else every point and the
    sweep stage, whose sweep.json names the selected one (runtime/stages/export.py)."""
    by_id = {s.id: s for s in ctx.stages}
    points = [by_id[d] for d in sweep.deps]
    named = sweep.params.get("export_point")
    if named is not None:
        stage = by_id[f"finetune.{sweep.params['task']}.{named}"]
        return ({"finetune_dir": stage.output_dir}, {"finetune": stage.fingerprint},
                [stage.id], stage)
    return ({"finetune_dirs": dict(sweep.inputs["finetune_dirs"]), "sweep_dir": sweep.output_dir},
            {"sweep": sweep.fingerprint}, [sweep.id, *(s.id for s in points)], points[0])


def points_estimated_alike(plan: Plan, ests: dict) -> dict[str, str]:
    """{point's stage id: an earlier point's} for each point of a sweep whose estimate reads
    as an earlier point's (points differing by seed or learning rate cost alike)."""
    out = {}
    for sweep in (s for s in plan.stages if s.kind == "sweep"):
        seen: dict = {}
        for sid in sweep.deps:
            if sid not in ests:
                continue
            text = tuple(ests[sid].lines(plan.accelerator))
            if text in seen:
                out[sid] = seen[text]
            else:
                seen[text] = sid
    return out


def sweep_lines(plan: Plan, ests: dict) -> list[str]:
    """The dry run's lines for each sweep: its grid and size, and the points' estimated wall
    time and cost summed (when every point has an estimate)."""

    lines = []
    for sweep in (s for s in plan.stages if s.kind == "sweep"):
        spec = SweepSpec.from_stage(sweep)
        values: dict = {}
        for settings in spec.points.values():
            for param, value in settings.items():
                values.setdefault(param, [])
                if value not in values[param]:
                    values[param].append(value)
        n = len(spec.points)
        lines.append(f"Sweep of {spec.task} ({sweep.id}): "
                     + " x ".join(f"{param} {len(v)}" for param, v in values.items())
                     + f" = {n} point{'s' if n != 1 else ''}, one finetune stage each")
        for param, v in values.items():
            lines.append(f"    {param}: {', '.join(value_text(x) for x in v)}")
        how = (f"the named point {spec.export_point}" if spec.export_point else
               "the selected point")
        metric = spec.select_metric or "the task score"
        lines.append(f"    selection: by {metric} on the dev sets: {spec.rule}")
        exported = any(s.kind == "export" and set(s.deps) & {sweep.id, *sweep.deps}
                       for s in plan.stages)
        lines.append(f"    export: {how}" if exported else
                     "    export: none of its points (no export, or the export is of the "
                     "pretrained encoder)")
        point_ests = [ests.get(d) for d in sweep.deps]
        if point_ests and all(e is not None and e.hours is not None for e in point_ests):
            hours = sum(e.hours for e in point_ests)
            money = ""
            if all(e.usd for e in point_ests):
                money = (f"; about ${sum(e.usd for e in point_ests):,.0f} on demand, "
                         f"${sum(e.usd_preemptible for e in point_ests):,.0f} preemptible")
            lines.append(f"    wall time of every point on {plan.accelerator['name']}: about "
                         f"{_duration(hours)}{money}")
        lines.append("")
    return lines
