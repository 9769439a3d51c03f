"""Ablations: a grid over any experiment binding, expanded into one plan.

    experiment.ablation = {'MASKED_LM_PROB': [0.15, 0.2]}

A key is a gin macro (``MASKED_LM_PROB``) or a binding (``train.learning_rate``,
``wiki/bert_pretraining_task.dupe_factor``); its values are tried in every combination (a
point). The experiment is compiled once per point, the point's values bound after every
gin file and --gin_param (compile_experiment in compiler/planner.py), and the plans are
merged: a stage whose fingerprint no key changes is one stage with its plain id (the
masking rate's ablation shares the corpus and the vocab); a stage that a key changes gets
the values of the keys that change it in its id and directory (``pretrain.masked_lm_prob0.2``),
its dependencies rewired to its point's own upstream stages. `--only`, `--until`, resume
and `runexp status` then work per point as for any stage. A fine-tuning sweep in an
ablation multiplies: each point gets its own finetune points and sweep stage.

No TensorFlow, no seqio.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Optional

from runexp.compiler.errors import ErrorCollector, Location, did_you_mean
from runexp.compiler.estimates import _duration
from runexp.compiler.loader import Assignment, ConfigurableRef, GinConfig, MacroRef
from runexp.compiler.plan import Plan, Stage
from runexp.compiler.schema import CONFIGURABLES
from runexp.compiler.sweep import value_text

KEY = ("", "experiment", "ablation")
EXAMPLE = "{'MASKED_LM_PROB': [0.15, 0.2]}"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")


@dataclasses.dataclass(frozen=True)
class Ablation:
    """Attributes:
      keys: (key as written, short name) per key, in the order written.
      points: point name -> {key: value}, in grid order (the last key fastest).
      location: the binding's file and line.
    """

    keys: tuple
    points: dict
    location: Location
    raw: dict = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        """'MASKED_LM_PROB 2 = 2 points'."""
        sizes = " x ".join(f"{key} {len({value_text(p[key]) for p in self.points.values()})}"
                           for key, _ in self.keys)
        n = len(self.points)
        return f"{sizes} = {n} point{'s' if n != 1 else ''}"

    def bound(self, config: GinConfig, point: str) -> GinConfig:
        """``config`` with the point's values bound last (at the ablation's line)."""
        macros = {k: list(v) for k, v in config.macros.items()}
        bindings = {k: list(v) for k, v in config.bindings.items()}
        for key, value in self.points[point].items():
            if "." in key:
                bindings.setdefault(_binding_key(key), []).append(
                    Assignment(value, self.location))
            else:
                macros.setdefault(key, []).append(Assignment(value, self.location))
        return dataclasses.replace(config, macros=macros, bindings=bindings)


def _binding_key(key: str) -> tuple[str, str, str]:
    scope, _, rest = key.rpartition("/")
    configurable, _, param = rest.rpartition(".")
    return scope, configurable, param


def _short(key: str) -> str:
    """A key's short name in stage ids: a macro lowercased, a binding's parameter name."""
    return _UNSAFE.sub("_", key.lower() if "." not in key else key.rpartition(".")[2])


def _value_name(value) -> str:
    return _UNSAFE.sub("_", value_text(value))


def read_ablation(config: GinConfig) -> tuple[Optional[Ablation], ErrorCollector]:
    """experiment.ablation checked and expanded: (None, collector) when it is unset or
    after recording why it cannot be (each problem once, at the binding's file and line)."""
    c = ErrorCollector()
    assignments = config.bindings.get(KEY)
    if not assignments:
        return None, c
    raw, where = assignments[-1].value, assignments[-1].location
    if raw is None:
        return None, c
    if not isinstance(raw, dict) or not raw:
        c.error(f"experiment.ablation must be a non-empty dict of key -> values, got {raw!r}",
                where, hint=f"e.g. experiment.ablation = {EXAMPLE}, or unset it")
        return None, c
    keys, axes = [], []
    for key, values in raw.items():
        label = f"experiment.ablation[{key!r}]"
        if not isinstance(key, str) or not key:
            c.error(f"{label}: a key is a gin macro or a binding, as a string", where,
                    hint=f"e.g. experiment.ablation = {EXAMPLE}")
            continue
        if "." in key:
            scope, configurable, param = _binding_key(key)
            if configurable not in CONFIGURABLES:
                c.error(f"{label}: there is no configurable {configurable!r}", where,
                        hint=did_you_mean(configurable, CONFIGURABLES)
                        or f"configurables: {', '.join(CONFIGURABLES)}")
                continue
            if param not in CONFIGURABLES[configurable].params:
                c.error(f"{label}: {configurable} has no parameter {param!r}", where,
                        hint=did_you_mean(param, CONFIGURABLES[configurable].params)
                        or "see docs/STAGES.md for the settings")
                continue
            if configurable == "experiment" or (scope and not CONFIGURABLES[configurable].scoped):
                why = ("experiment settings apply to the whole plan"
                       if configurable == "experiment" else f"{configurable} is not scoped")
                c.error(f"{label}: {why}", where, hint="ablate a setting of a stage (a macro, "
                                                       "or e.g. train.learning_rate)")
                continue
        elif key not in config.macros:
            c.error(f"{label}: no macro {key} is defined", where,
                    hint=(did_you_mean(key, config.macros) or "")
                    + " (a key is a macro the experiment defines, or a binding such as "
                      "train.learning_rate)")
            continue
        if not isinstance(values, (list, tuple)) or not values:
            c.error(f"{label} must be a non-empty list of values, got {values!r}", where,
                    hint=f"e.g. {key!r}: [{values!r}]" if not isinstance(values, (list, tuple))
                    else f"list the values of {key} to try")
            continue
        if any(isinstance(v, (MacroRef, ConfigurableRef)) for v in values):
            c.error(f"{label}: values must be written out (no %MACRO or @reference)", where,
                    hint="write each value as a literal")
            continue
        names = [_value_name(v) for v in values]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            c.error(f"{label} lists {', '.join(repeated)} more than once", where,
                    hint="list each value once (values a stage id shows alike, such as 0.2 "
                         "and 0.2000001, are the same point)")
            continue
        keys.append(key)
        axes.append(tuple(values))
    if c.errors:
        return None, c
    shorts = [_short(k) for k in keys]
    for key, short in zip(keys, shorts):
        if shorts.count(short) > 1:
            alike = ", ".join(k for k, s in zip(keys, shorts) if s == short)
            c.error(f"experiment.ablation: keys {alike} would show alike ({short}) in stage "
                    "ids", where,
                    hint="ablate one of them, or bind it through a macro of another name")
            return None, c
    points = {}
    for combo in itertools.product(*axes):
        name = ".".join(f"{s}{_value_name(v)}" for s, v in zip(shorts, combo))
        points[name] = dict(zip(keys, combo))
    if len(points) < 2:
        c.error(f"experiment.ablation has one point ({next(iter(points))}): nothing to "
                "compare", where, hint="list two or more values, or bind the value directly")
        return None, c
    return Ablation(tuple(zip(keys, shorts)), points, where, dict(raw)), c


def _rewrite(value, dirs: dict):
    """Paths under a renamed stage's directory moved to its new one."""
    if isinstance(value, str):
        for old, new in dirs.items():
            if value == old or value.startswith(old + "/"):
                return new + value[len(old):]
        return value
    if isinstance(value, (list, tuple)):
        return [_rewrite(v, dirs) for v in value]
    if isinstance(value, dict):
        return {k: _rewrite(v, dirs) for k, v in value.items()}
    return value


def _rename_refs(value, ids: dict):
    """A vocab source's ``settings_from`` (a stage id) renamed as its stage is."""
    if isinstance(value, dict):
        return {k: ids.get(v, v) if k == "settings_from" and isinstance(v, str)
                else _rename_refs(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename_refs(v, ids) for v in value]
    return value


def _operative(ablation: Ablation, text: str, provenance: dict) -> str:
    """The first point's operative config made to replay every point: the bindings an
    ablated macro reached bound to it again, the macro set to the first value, the grid last.
    ``provenance``: the first point's resolver's (compiler/resolve.py)."""
    lines = text.splitlines()
    first = next(iter(ablation.points.values()))
    for key, _ in ablation.keys:
        if "." in key:
            continue
        for prov in provenance.values():
            if any(step.what == key for step in prov.steps):
                lines = [f"{prov.name} = %{key}  # {ablation.location}"
                         if line.startswith(f"{prov.name} = ") else line for line in lines]
        lines.append(f"{key} = {first[key]!r}  # {ablation.location}")
    lines.append(f"experiment.ablation = {ablation.raw!r}  # {ablation.location}")
    return "\n".join(lines) + "\n"


def merge(ablation: Ablation, plans: dict[str, Plan], collector: ErrorCollector,
          provenance: Optional[dict] = None) -> Optional[Plan]:
    """One plan of every point's (``plans``: point name -> its plan): equal stages once,
    the others once per value of the keys that change them. None after recording why the
    points cannot share one plan. ``provenance``: the first point's resolver's, for the
    operative config."""
    first = next(iter(plans.values()))
    for name, plan in plans.items():
        for what in ("output_root", "accelerator", "launch"):
            if getattr(plan, what) != getattr(first, what):
                collector.error(f"experiment.ablation: point {name} changes the experiment's "
                                f"{what.replace('_', ' ')}, which the points share",
                                ablation.location,
                                hint="ablate settings of stages; run a separate experiment "
                                     "for another output root or accelerator")
                return None
    by_point = {name: {s.id: s for s in plan.stages} for name, plan in plans.items()}
    order: list[str] = []  # every stage id of every point, upstream first
    for plan in plans.values():
        previous = None
        for s in plan.stages:
            if s.id not in order:
                order.insert(order.index(previous) + 1 if previous else 0, s.id)
            previous = s.id
    names = list(plans)
    keys = [k for k, _ in ablation.keys]

    def fp(point: str, sid: str):
        stage = by_point[point].get(sid)
        return stage.fingerprint if stage else None

    def along(k: str):
        """Pairs of points differing only in key ``k``."""
        return [(a, b) for a, b in itertools.combinations(names, 2)
                if all(ablation.points[a][o] == ablation.points[b][o] for o in keys if o != k)]

    def params(point: str, sid: str):
        stage = by_point[point].get(sid)
        return repr(stage.params) if stage else None

    # A key changes a stage when two points differing only in that key plan it differently;
    # it changes only how the stage runs when their params differ but not their fingerprints.
    changing = {sid: [k for k in keys if any(fp(a, sid) != fp(b, sid) for a, b in along(k))]
                for sid in order}
    how = {k: [sid for sid in order if k not in changing[sid] and any(
        params(a, sid) != params(b, sid) for a, b in along(k))] for k in keys}
    short = dict(ablation.keys)

    def new_id(point: str, sid: str) -> str:
        suffix = ".".join(f"{short[k]}{_value_name(ablation.points[point][k])}"
                          for k in changing[sid])
        return f"{sid}.{suffix}" if suffix else sid

    ids = {p: {sid: new_id(p, sid) for sid in by_point[p]} for p in names}
    root = first.output_root.rstrip("/")
    stages: list[Stage] = []
    seen: dict[str, str] = {}
    for sid in order:
        for p in names:
            stage = by_point[p].get(sid)
            if stage is None:
                continue
            nid = ids[p][sid]
            if nid in seen:
                if seen[nid] != stage.fingerprint:  # keys changing it together, not alone
                    collector.error(f"experiment.ablation: stage {sid} differs between points "
                                    "that its id cannot tell apart", ablation.location,
                                    hint="please report this with your gin files")
                    return None
                continue
            seen[nid] = stage.fingerprint
            dirs = {s.output_dir: f"{root}/{ids[p][s.id]}" for s in by_point[p].values()
                    if ids[p][s.id] != s.id}
            stages.append(dataclasses.replace(
                stage, id=nid, output_dir=_rewrite(stage.output_dir, dirs),
                params=_rename_refs(_rewrite(dict(stage.params), dirs), ids[p]),
                inputs=_rewrite(dict(stage.inputs), dirs),
                deps=tuple(ids[p][d] for d in stage.deps)))
    clash = sorted({nid for p in names for sid, nid in ids[p].items() if nid != sid}
                   & set(order))
    if clash:
        collector.error(f"experiment.ablation: a point's stage id {clash[0]} is another "
                        "stage's", ablation.location,
                        hint="ablate the setting through a macro of another name")
        return None

    def note(k: str) -> str:
        sids = how[k]
        return (f"; it changes only how {', '.join(sids)} run{'s' if len(sids) == 1 else ''}, "
                f"not what {'it makes' if len(sids) == 1 else 'they make'}: the first value "
                "is planned" if sids else "")

    if all(not changing[sid] for sid in order):
        collector.warn("experiment.ablation changes no stage of the plan: every point plans "
                       f"the same stages{''.join(note(k) for k in keys)}", ablation.location,
                       hint="ablate a setting the plan uses (runexp --explain=NAME shows where "
                            "a value is used)")
    else:
        for key in keys:
            if not any(key in changing[sid] for sid in order):
                collector.warn(f"experiment.ablation[{key!r}] changes no stage of the "
                               f"plan{note(key)}", ablation.location,
                               hint="remove it, or ablate a setting the plan uses")
    warnings = []
    for plan in plans.values():
        warnings += [w for w in plan.warnings if w not in warnings]
    warnings += [w.render() for w in collector.warnings if w.render() not in warnings]
    info = {"where": str(ablation.location), "keys": {k: s for k, s in ablation.keys},
            "points": {n: dict(v) for n, v in ablation.points.items()},
            "shared": [sid for sid in order if not changing[sid]],
            "per_point": {sid: changing[sid] for sid in order if changing[sid]}}
    config = _operative(ablation, first.operative_config, provenance or {})
    return dataclasses.replace(first, stages=tuple(stages), warnings=tuple(warnings),
                               ablation=info, operative_config=config)


def ablation_lines(plan: Plan, ests: dict) -> list[str]:
    """The dry run's Ablation block: the grid and its size, the stages shared and those
    planned per point, and every stage's estimated wall time and cost summed."""
    info = getattr(plan, "ablation", None)
    if not info:
        return []
    points: dict = info["points"]
    keys = list(info["keys"])
    values = {k: [] for k in keys}
    for settings in points.values():
        for k in keys:
            if settings[k] not in values[k]:
                values[k].append(settings[k])
    n = len(points)
    lines = [f"Ablation ({info['where']}): "
             + " x ".join(f"{k} {len(v)}" for k, v in values.items())
             + f" = {n} point{'s' if n != 1 else ''}"]
    for k, v in values.items():
        lines.append(f"    {k} ({info['keys'][k]}): {', '.join(value_text(x) for x in v)}")
    shared = list(info["shared"])
    lines.append(f"    shared by every point: {', '.join(shared) if shared else 'none'}")
    groups: dict = {}
    for sid, changed in info["per_point"].items():
        groups.setdefault(" x ".join(changed), []).append(sid)
    for changed, sids in groups.items():
        lines.append(f"    one per value of {changed}: {', '.join(sids)}")
    lines.append(f"    stages: {len(plan.stages)} ({len(shared)} shared)")
    known = [ests[s.id] for s in plan.stages if s.id in ests]
    if known and all(e.hours is not None for e in known):
        money = ""
        if all(e.usd for e in known):
            money = (f"; about ${sum(e.usd for e in known):,.0f} on demand, "
                     f"${sum(e.usd_preemptible for e in known):,.0f} preemptible")
        lines.append(f"    wall time in all on {plan.accelerator.get('name', 'this machine')} "
                     f"(every point's training, shared stages once): about "
                     f"{_duration(sum(e.hours for e in known))}{money}")
    lines.append("")
    return lines

