"""Plans as text for people, terraform-style: what will happen to each stage, and why."""

from __future__ import annotations

import os
from typing import Any, Sequence

from runexp.compiler import wall_time
from runexp.compiler.ablation import ablation_lines
from runexp.compiler.estimates import estimates, pretraining_total
from runexp.compiler.packing import packing_of
from runexp.compiler.kinds import KINDS
from runexp.compiler.plan import RUN_TIME, Plan
from runexp.compiler.stages.runner import runner_lines
from runexp.compiler.state import CREATE, REBUILD, RESUME, REUSE, SKIP, StageState
from runexp.compiler.sweep import points_estimated_alike, sweep_lines
from runexp.compiler.terminal import paint

SYMBOLS = {CREATE: "+", REBUILD: "~", RESUME: ">", REUSE: "=", SKIP: "-"}
LEGEND = {CREATE: "create", REBUILD: "rebuild", RESUME: "resume", REUSE: "reuse", SKIP: "skip"}
PARTICIPLES = {CREATE: "created", REBUILD: "rebuilt", RESUME: "resumed", REUSE: "reused",
               SKIP: "skipped"}
ORDER = (CREATE, REBUILD, RESUME, REUSE, SKIP)
STYLES = {CREATE: "green+bold", REBUILD: "yellow+bold", RESUME: "cyan+bold", REUSE: "dim",
          SKIP: "dim"}  # on a terminal (compiler/terminal.py)


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and len(value) > 3:
        return "[" + ", ".join(_value(v) for v in value[:3]) + f", ... ({len(value)} in all)]"
    return repr(value)


def _short_path(path, root: str):
    """Paths under the output root as <root>/...; lists and dicts of paths element-wise."""
    if isinstance(path, list):
        return [_short_path(p, root) for p in path]
    if isinstance(path, dict):
        return {k: _short_path(p, root) for k, p in path.items()}
    if path.startswith(root.rstrip("/") + "/"):
        return "<root>/" + path[len(root.rstrip("/")) + 1:]
    return path


def _display(path: str) -> str:
    """runexp's own gin files as gin/...; files under the current directory relative to it."""
    parts = path.replace(os.sep, "/").split("/")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] in ("gin", "configs") and os.path.isfile(
                os.path.join("/".join(parts[:i + 1]), "quickstart.gin")):
            return "gin/" + "/".join(parts[i + 1:])
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _unlisted_why(listing: str) -> str:
    return listing[len("not listed: "):] if listing.startswith("not listed: ") else listing


def unlisted_stages(plan: Plan) -> list[str]:
    """Stages whose fingerprint rests on a gs:// input that was not listed, their own or an
    upstream stage's: a change to those objects would go unseen."""
    out: list[str] = []
    for stage in plan.stages:  # in plan order, so upstream stages come first
        own = any(isinstance(v, str) for v in (stage.input_objects or {}).values())
        if own or any(dep in out for dep in stage.deps):
            out.append(stage.id)
    return out


def _unlisted_lines(plan: Plan, unlisted: Sequence[str]) -> list[str]:
    reasons = sorted({_unlisted_why(v) for s in plan.stages
                      for v in (s.input_objects or {}).values() if isinstance(v, str)})
    n = len({k for s in plan.stages for k, v in (s.input_objects or {}).items()
             if isinstance(v, str)})
    return [f"{paint('Inputs not listed:', 'yellow+bold')} {n} gs:// input"
            f"{'' if n == 1 else 's'} ({'; '.join(reasons)}). The fingerprints of "
            f"{len(unlisted)} stage{'' if len(unlisted) == 1 else 's'} "
            f"({', '.join(unlisted)}) are provisional: a change to those objects goes unseen "
            "until they can be listed.", ""]


def summary_line(states: dict[str, StageState]) -> str:
    counts = {a: sum(1 for s in states.values() if s.action == a) for a in ORDER}
    parts = [f"{counts[a]} to {LEGEND[a]}" for a in ORDER if counts[a]]
    return "Plan: " + (", ".join(parts) if parts else "nothing to do") + "."


def _budget_lines(plan: Plan, stage_id: str, est) -> list[str]:
    """With a wall-time budget: the margin kept free and the step a fresh run is expected to
    stop at (at the estimated step time; the runtime replans from measured ones)."""
    hours = (plan.launch or {}).get("wall_time_hours")
    stage = plan.stage(stage_id)
    if not hours or est.hours is None or not KINDS[stage.kind].trains:
        return []
    budget = hours * 3600.0
    chosen = plan.launch.get("wall_time_margin_minutes")
    margin = wall_time.margin_s(budget, est.parameters, chosen)
    steps = stage.params["train_steps"]
    last = wall_time.expected_last_step(
        budget, margin, est.hours * 3600.0 / steps,
        # a fine-tune checkpoints at its end only
        stage.params["checkpoint_every"] if "checkpoint_every" in stage.params else steps,
        wall_time.assumed_save_seconds(est.parameters), train_steps=steps)
    how = "experiment.wall_time_margin_minutes" if chosen is not None else \
        "auto, for the budget and the model; set experiment.wall_time_margin_minutes"
    out = [f"wall-time budget: {hours:g} h, of which {margin / 60:.1f} min kept free ({how})",
           f"expected last step of a fresh run: {last:,} of {steps:,}"
           + (" (a later run continues)" if last < steps else "")]
    if last < steps:  # later sessions: each restarts first (compiler/wall_time.py)
        cost = wall_time.restart_cost(est.parameters, plan.accelerator.get("type", "cpu"))
        later = wall_time.expected_last_step(
            budget, margin, est.hours * 3600.0 / steps,
            stage.params["checkpoint_every"] if "checkpoint_every" in stage.params else steps,
            wall_time.assumed_save_seconds(est.parameters),
            startup_s=cost.seconds - cost.stop_save_s)
        n = wall_time.sessions(steps, last, later)
        out.append(f"sessions of {hours:g} h to the end: {n or 'never (a restart takes the '}"
                   + (f" ({n - 1} restart{'' if n == 2 else 's'}, {cost.describe()})" if n
                      else "budget)"))
    return out


def render_plan(plan: Plan, states: dict[str, StageState], dry_run: bool = True,
                verbose: bool = True, preflight: Sequence[str] = ()) -> str:
    lines = [f"runexp plan for experiment {plan.experiment!r}"]
    unlisted = unlisted_stages(plan)
    lines.append(f"  gin files:   {', '.join(_display(f) for f in plan.gin_files_read)}")
    if plan.gin_params:
        lines.append(f"  gin params:  {' '.join(plan.gin_params)}")
    lines.append(f"  output root: {plan.output_root}")
    if plan.accelerator:
        a = plan.accelerator
        lines.append(f"  accelerator: {a['name']} ({a['type']}, {a['replicas']} "
                     f"replica{'s' if a['replicas'] != 1 else ''})")
    launch = plan.launch or {}
    if (launch.get("max_attempts") or 1) > 1:
        lines.append(f"  relaunch:    up to {launch['max_attempts']} launches when preempted, "
                     f"{launch.get('relaunch_backoff_s', 0):g} s apart (doubling)")
    if launch.get("wall_time_hours"):
        lines.append(f"  budget:      stop with a checkpoint after {launch['wall_time_hours']:g} h "
                     "of wall time (a later run continues)")
    for imp in plan.imports:
        lines.append(f"  gin import (runs code when loaded by gin): {imp}")
    present = [a for a in ORDER if any(s.action == a for s in states.values())]
    lines.append("")
    lines.append("Actions: " + "   ".join(f"{SYMBOLS[a]} {LEGEND[a]}" for a in present))
    lines.append("")
    for stage in plan.stages:
        st = states[stage.id]
        lines.append(f"{paint(SYMBOLS[st.action], STYLES[st.action])} "
                     f"{paint(stage.id, 'bold')}  ({stage.kind})  will be "
                     f"{PARTICIPLES[st.action]}")
        lines.append(f"    why: {st.reason}")
        packing = packing_of(plan, stage) if stage.kind == "pretrain" else None
        if packing is not None:  # what batch_size counts, on packed rows (compiler/packing.py)
            lines.append(f"    {packing.lines(stage.params['max_seq_length'])[1]}")
        for name, old, new in st.changes:
            lines.append(f"    ~ {name}: {_value(old)} -> {_value(new)}")
        if verbose and st.action not in (REUSE, SKIP):
            for name in sorted(stage.params):
                where = stage.provenance.get(name, "")
                if stage.params[name] is None and where == RUN_TIME:
                    lines.append(f"    {name} = ({RUN_TIME})")
                    continue
                lines.append(f"    {name} = {_value(stage.params[name])}"
                             + (f"   # {where}" if where else ""))
            for name, value in sorted(stage.inputs.items()):
                lines.append(f"    <- {name}: {_value(_short_path(value, plan.output_root))}")
            for key, listing in sorted((stage.input_objects or {}).items()):
                if isinstance(listing, dict):  # what a gs:// input matched when compiled
                    size = sum(o.get("size") or 0 for o in listing.values())
                    lines.append(f"       {key} matches {len(listing):,} object"
                                 f"{'' if len(listing) == 1 else 's'} ({size:,} bytes)")
                else:
                    lines.append(f"       {key} {paint('NOT LISTED', 'yellow+bold')} "
                                 f"({_unlisted_why(listing)}): its objects are unknown")
        provisional = ", provisional: gs:// inputs not listed" if stage.id in unlisted else ""
        lines.append(f"    -> {_short_path(stage.output_dir, plan.output_root)}/"
                     f"  (fingerprint {stage.fingerprint[:12]}{provisional})")
        lines.append("")
    ests = estimates(plan)
    alike = points_estimated_alike(plan, ests)  # a sweep's points: each estimate once
    for stage_id, est in ests.items():
        if stage_id in alike:
            lines += [f"Estimates for {stage_id}: as for {alike[stage_id]}", ""]
            continue
        lines.append(f"Estimates for {stage_id} (see compiler/estimates.py for how they are "
                     "made):")
        lines += [f"    {line}" for line in est.lines(plan.accelerator)]
        lines += [f"    {line}" for line in _budget_lines(plan, stage_id, est)]
        lines.append("")
    lines += sweep_lines(plan, ests)  # each fine-tuning sweep: grid, size, time and cost
    lines += ablation_lines(plan, ests)  # experiment.ablation: grid, shared stages, time
    for stage in plan.stages:  # a preprocess stage's Beam runner (compiler/stages/runner.py)
        runner = runner_lines(plan, stage) if stage.kind == "preprocess" else []
        if runner:
            lines.append(f"Runner of {stage.id}:")
            lines += [f"    {line}" for line in runner]
            lines.append("")
    total = pretraining_total(plan, ests) if not plan.ablation else []  # points: not phases
    if total:
        lines.append("Estimates for pretraining, every phase:")
        lines += [f"    {line}" for line in total]
        lines.append("")
    if preflight:
        lines.append("Preflight (storage; see compiler/preflight.py):")
        lines += [f"    {finding}" for finding in preflight]
        lines.append("")
    for w in plan.warnings:
        lines.append(w)
        lines.append("")
    if unlisted:
        lines += _unlisted_lines(plan, unlisted)
    lines.append(summary_line(states))
    if dry_run:
        probed = any("probe object" in f or "can create and delete objects" in f
                     for f in preflight)
        lines.append("This was a dry run: nothing was executed or written"
                     + (" (but the preflight's probe object, deleted at once)" if probed else "")
                     + ". Run the same command without --dry_run to apply the plan.")
    return "\n".join(lines)
