"""Planning mixtures: which tasks train.task names, and what their tasks must agree on.

The agreement rules are declared on the spec fields (`mixture="same: why"`), not here.
"""

from __future__ import annotations

from typing import Optional

from runexp.compiler.errors import did_you_mean
from runexp.compiler.specs import PreprocessSpec
from runexp.compiler.specs.source import SourceSpec
from runexp.compiler.stages.common import PlanContext


def member_files(ctx: PlanContext, task: str, param: str,
                 members: Optional[list[str]] = None) -> tuple[list, dict, list]:
    """``ctx.files`` of a task's train_files or validation_files; of a mixture, the union
    over its tasks (in name order; ``members``: only these)."""
    out, fps, deps = [], {}, []
    for t in members if members is not None else pretraining_members(ctx, task) or [task]:
        patterns = ctx.r.get("bert_pretraining_task", param, t) or []
        found, f, d = ctx.files(patterns, f"{t}.{param}",
                                ctx.loc("bert_pretraining_task", param, t))
        out.extend(u for u in found if u not in out)
        fps.update(f)
        deps.extend(d)
    return out, fps, sorted(set(deps))


def member_source(ctx: PlanContext, task: str) -> SourceSpec:
    """A bert_pretraining_task's source settings as gin binds them (a value the resolver
    refused, and reported, keeps its default)."""
    values = {}
    for s in SourceSpec.settings():
        value = ctx.r.get("bert_pretraining_task", s.name, task)
        if value is not None:
            values[s.name] = value
    try:
        return SourceSpec.pick(values)
    except ValueError:
        return SourceSpec()


def pretraining_members(ctx: PlanContext, name: str) -> Optional[list[str]]:
    """The bert_pretraining_tasks that train.task = ``name`` trains on: the task itself, or
    a mixture's tasks in name order (the runtime samples them in that order, so reordering
    the gin dict changes nothing). None after reporting a problem."""
    if name not in ctx.r.scopes("bert_pretraining_mixture"):
        return [name]
    if name not in ctx.checked_mixtures:
        ctx.checked_mixtures[name] = check_mixture(ctx, name)
    return ctx.checked_mixtures[name]


def agreement_rules(dynamic: bool) -> list[tuple[str, str]]:
    """(param, why) of the settings a mixture's tasks must share: always the "same" ones,
    and when every task masks at training time also the "same_if_dynamic" ones."""
    rules = []
    for wanted in ("same", "same_if_dynamic"):
        if wanted == "same_if_dynamic" and not dynamic:
            break
        for s in PreprocessSpec.settings():
            rule, _, why = s.mixture.partition(":")
            if rule == wanted:
                rules.append((s.name, why.strip()))
    return rules


def check_mixture(ctx: PlanContext, name: str) -> Optional[list[str]]:
    tasks = ctx.r.scopes("bert_pretraining_task")
    mixtures = ctx.r.scopes("bert_pretraining_mixture")
    label = f"{name}/bert_pretraining_mixture.rates"
    loc = ctx.loc("bert_pretraining_mixture", "rates", name)
    errors = len(ctx.c.errors)
    if name in tasks:
        ctx.c.error(f"{name!r} is both a bert_pretraining_task and a bert_pretraining_mixture",
                    loc, hint="rename one of them: tasks and mixtures share one seqio registry")
    rates = ctx.r.get("bert_pretraining_mixture", "rates", name)
    if rates is None:
        return None  # reported by the resolver
    if not rates:
        ctx.c.error(f"{label} is empty", loc,
                    hint="name the tasks and their rates, e.g. {'wiki': 0.7, 'books': 0.3}")
    for task, rate in rates.items():
        if task in mixtures:
            ctx.c.error(f"{label}: {task!r} is a mixture; the members of a mixture must be "
                        "bert_pretraining_tasks", loc,
                        hint=f"list the tasks of {task!r} here instead")
        elif task not in tasks:
            ctx.c.error(f"{label} names {task!r}, which is not a registered "
                        "bert_pretraining_task", loc,
                        hint=(did_you_mean(str(task), tasks) or "") + " (register one "
                        f"with {task}/bert_pretraining_task.train_files = [...])")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) \
                or not 0 < rate < float("inf"):
            ctx.c.error(f"{label}: the rate of {task!r} must be a positive number, got "
                        f"{rate!r}", loc,
                        hint="rates are relative: {'wiki': 0.7, 'books': 0.3} samples wiki "
                             "7 times in 10")
    if len(ctx.c.errors) > errors:
        return None
    members = sorted(rates)
    dynamic = all(ctx.r.get("bert_pretraining_task", "dynamic_masking", t) for t in members)
    first = members[0]
    for param, why in agreement_rules(dynamic):
        want = ctx.r.get("bert_pretraining_task", param, first)
        for task in members[1:]:
            got = ctx.r.get("bert_pretraining_task", param, task)
            if got != want:
                ctx.c.error(f"mixture {name!r}: task {task!r} has {param} = {got!r} but task "
                            f"{first!r} has {want!r}",
                            ctx.loc("bert_pretraining_task", param, task) or loc,
                            hint=f"{why}: give its tasks the same {param}")
    return None if len(ctx.c.errors) > errors else members
