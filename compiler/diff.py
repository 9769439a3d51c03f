"""`runexp diff OLD NEW`: what differs between two experiments, and what NEW would rebuild.

    runexp diff quickstart.gin my_quickstart.gin           # two gin experiments
    runexp diff runexp_output/a runexp_output/b            # two runs: their metrics too
    runexp diff runexp_output/quickstart my_quickstart.gin # what a change would rebuild there
    runexp diff plan_a.json plan_b.json                    # plans saved with --plan_out

OLD and NEW are each a gin experiment file, the output root of a run (a directory or gs://
prefix holding plan.json), or a plan saved with ``--dry_run --plan_out``. A gin file is
compiled as ``--dry_run --offline`` compiles it: gin-config's parser, no gs:// input listed,
no storage touched, no TensorFlow.

It prints:
  - the values that differ, by stage and parameter, each with the file:line that set it on
    either side (``~ pretrain.learning_rate: 0.001 (a.gin:24) -> 0.002 (b.gin:25)``), and
    the stages and values only one side has; equal values are only counted. The comparison
    is structural (compiler/plan_diff.py): a line inserted in a gin file changes no entry.
  - for every stage, what NEW would do with it where OLD ran, compared by fingerprint:
    reused, rebuilt for its own changed values, rebuilt only because an upstream stage
    changed, continued from OLD's checkpoints, created or dropped.
  - for two runs, their metrics side by side with the difference: held-out MLM accuracy,
    MLM loss and NSP accuracy (evaluate), each fine-tune's dev accuracy
    (compiler/diff_metrics.py).

Exit codes (compiler/exit_codes.py): 0 the same; 1 an input could not be read (the message
says which, what is wrong and what to do); 4 (EXIT_DIFFERENT) they differ. diff(1) says
"different" with 1, but runexp's 1 is a user error, and 2 is "a dry run found work to do",
which a difference need not mean (a changed relaunch setting rebuilds nothing); 4 is the
first code runexp does not use for anything else. Provenance alone (a value that moved to
another line or file) is not a difference; nor are the experiment's name and output root.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from typing import Any, Optional, Sequence

from runexp.compiler.errors import Problem, UserError
from runexp.compiler.arguments import ArgumentParser
from runexp.compiler.exit_codes import EXIT_DIFFERENT, EXIT_OK, EXIT_USER_ERROR
from runexp.compiler.plan import Plan
from runexp.compiler.plan_diff import ABSENT, DROP, PlanDiff, ValueChange, diff_plans
from runexp.compiler.render import PARTICIPLES, SYMBOLS
from runexp.compiler.state import CREATE, REBUILD, RESUME, REUSE
from runexp.compiler.terminal import highlight
from runexp.compiler.diff_metrics import metric_rows
from runexp.compiler.gcs_inputs import OFFLINE, SKIP_ENV
from runexp.compiler.planner import compile_experiment
from runexp.runtime.report.collect import NoExperiment, collect

_SIDE_HINT = ("OLD and NEW are each a gin experiment file, an experiment's output root (the "
              "directory or gs:// prefix holding plan.json after a run), or a plan saved with "
              "--dry_run --plan_out=FILE")


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of the diff: what the user named, its plan, and, for a run, what
    runtime/report/collect.py read from its output root (statuses, stage directories)."""

    given: str
    what: str  # "gin file", "run", "saved plan"
    plan: Plan
    run: Any = None  # a report.collect.Report

    def describe(self) -> str:
        plan = self.plan
        if self.run is not None:
            done = sum(1 for s in self.run.stages if s.done)
            return (f"{self.given} (run of experiment {plan.experiment!r}, {done} of "
                    f"{len(plan.stages)} stages done)")
        return f"{self.given} ({self.what}: experiment {plan.experiment!r}, output root " \
               f"{_near(plan.output_root)})"


def _near(path: str) -> str:
    """A local path under the current directory relative to it; others as they are."""
    if path.startswith("gs://"):
        return path
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


@contextlib.contextmanager
def _offline():
    """The compile of `--dry_run --offline`: gs:// inputs are not listed (no storage)."""

    before = os.environ.get(SKIP_ENV)
    os.environ[SKIP_ENV] = OFFLINE
    try:
        yield
    finally:  # restored: a caller in the same process (a test, a notebook) is not affected
        if before is None:
            os.environ.pop(SKIP_ENV, None)
        else:
            os.environ[SKIP_ENV] = before


def _run(given: str) -> Side:
    try:
        report = collect(given, draw=False)
    except NoExperiment as e:
        raise UserError(Problem(str(e), hint=_SIDE_HINT))
    except Exception as e:  # noqa: BLE001 - gs:// without credentials or network
        if not given.startswith("gs://"):
            raise
        raise UserError(Problem(f"cannot read {given}: {type(e).__name__}",
                                hint="check the path and your Google credentials "
                                     "(gcloud auth application-default login)"))
    return Side(given, "run", report.plan, report)


def _saved_plan(given: str) -> Side:
    try:
        with open(given, encoding="utf-8") as f:
            return Side(given, "saved plan", Plan.from_json(f.read()))
    except OSError as e:
        raise UserError(Problem(f"cannot read {given}: {e.strerror}", hint=_SIDE_HINT))
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(Problem(f"{given} is not a runexp plan: {e}", hint=_SIDE_HINT))


def _gin(given: str, search_paths: Sequence[str]) -> Side:
    with _offline():
        plan = compile_experiment([given], (), search_paths).plan
    return Side(given, "gin file", plan)


def load_side(given: str, search_paths: Sequence[str] = ()) -> Side:
    """Reads one side. Raises UserError."""
    if given.startswith("gs://") or os.path.isdir(given):
        return _run(given.rstrip("/") or given)
    if given.endswith(".json"):
        return _saved_plan(given)
    if not given.endswith(".gin") and not os.path.exists(given):
        raise UserError(Problem(f"{given!r} does not exist", hint=_SIDE_HINT))
    return _gin(given, search_paths)


def _show(value: Any) -> str:
    """repr, with long lists and dicts (a model) cut after three items."""
    if isinstance(value, dict):
        items = [f"{k}: {_show(v)}" for k, v in list(value.items())[:3]]
        more = f", ... ({len(value)} in all)" if len(value) > 3 else ""
        return "{" + ", ".join(items) + more + "}"
    if isinstance(value, list) and len(value) > 3:
        return "[" + ", ".join(_show(v) for v in value[:3]) + f", ... ({len(value)} in all)]"
    return repr(value)


def _with_where(value: Any, where: str) -> str:
    return _show(value) + (f" ({where})" if where else "")


def _value_line(c: ValueChange) -> str:
    if c.old is ABSENT:
        return f"  + {c.key}: {_with_where(c.new, c.new_where)}"
    if c.new is ABSENT:
        return f"  - {c.key}: {_with_where(c.old, c.old_where)}"
    return f"  ~ {c.key}: {_with_where(c.old, c.old_where)} -> {_with_where(c.new, c.new_where)}"


def _value_lines(d: PlanDiff) -> list[str]:
    """The stages on one side only last: a line each, then the params a file or flag set."""
    one_sided = {s.id: s for s in d.stages if s.only_in}
    lines = [_value_line(c) for c in d.values if c.stage not in one_sided]
    for stage in one_sided.values():
        lines.append(f"  {'-' if stage.only_in == 'OLD' else '+'} stage {stage.id} "
                     f"({stage.kind}): only in {stage.only_in}; the values a file or flag set:")
        lines += ["  " + _value_line(c) for c in d.values if c.stage == stage.id]
    return lines


_VERB = {**PARTICIPLES, DROP: "dropped"}
_MARK = {**SYMBOLS, DROP: "-"}


def _stage_lines(d: PlanDiff) -> list[str]:
    width = max((len(s.id) for s in d.stages), default=0)
    lines = [f"  {_MARK[s.action]} {s.id:<{width}}  {_VERB[s.action]}: {s.reason}"
             for s in d.stages]
    counts = [f"{len(d.actions(a))} {_VERB[a]}" for a in (REBUILD, RESUME, CREATE, DROP, REUSE)
              if d.actions(a)]
    return lines + ["  " + ", ".join(counts) + "."]


def _metric_lines(old: Side, new: Side) -> list[str]:
    rows = metric_rows(old.run, new.run)
    if not rows:
        return ["  none yet: neither run has a finished evaluate or finetune stage"]
    width = max(len(r.stage) for r in rows), max(len(r.metric) for r in rows)
    lines = []
    for r in rows:
        old_v = "—" if r.old is None else f"{r.old:.4f}"
        new_v = "—" if r.new is None else f"{r.new:.4f}"
        delta = "" if r.delta is None else f"{r.delta:+.4f}" + (f" {r.verdict}" if
                                                                 r.verdict else "")
        lines.append(f"  {r.stage:<{width[0]}}  {r.metric:<{width[1]}}  {old_v:>7} -> "
                     f"{new_v:>7}  {delta}".rstrip())
    return lines


def render(old: Side, new: Side, d: PlanDiff) -> str:
    lines = ["runexp diff", f"  OLD: {old.describe()}", f"  NEW: {new.describe()}", ""]
    n = len(d.values)
    lines.append(f"Values: {n} differ{'s' if n == 1 else ''} ({d.equal} equal, not shown)")
    lines += _value_lines(d)
    lines += ["", "Stages, if NEW ran where OLD did (compared by fingerprint):"]
    lines += _stage_lines(d)
    if old.run is not None and new.run is not None:
        lines += ["", "Metrics (OLD -> NEW, difference):"]
        lines += _metric_lines(old, new)
    lines.append("")
    lines.append("Same: nothing differs." if d.same else
                 f"Different: {n} value{'' if n == 1 else 's'}, "
                 f"{sum(1 for s in d.stages if s.differs)} stage(s) differ.")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="runexp diff", hint=_SIDE_HINT,
                description="What differs between two experiments (gin files, runs' output "
                            "roots, or saved plans), and what NEW would rebuild where OLD ran. "
                            f"Exit codes: 0 the same, 1 an input could not be read, "
                            f"{EXIT_DIFFERENT} they differ.")
    p.add_argument("old", metavar="OLD", help="a gin file, an output root, or a saved plan")
    p.add_argument("new", metavar="NEW", help="the same kinds of thing as OLD")
    p.add_argument("--gin_search_path", action="append", default=[], metavar="DIR",
                   help="directory to look for gin files and includes in (repeatable)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    sides = []
    for label, given in (("OLD", args.old), ("NEW", args.new)):
        try:
            sides.append(load_side(given, args.gin_search_path))
        except UserError as e:
            print(f"runexp diff: cannot read {label}, {given}:\n" + highlight(e.render()),
                  file=sys.stderr)
            return EXIT_USER_ERROR
    old, new = sides
    finished = {s.stage.id for s in old.run.stages if s.done} if old.run is not None else None
    d = diff_plans(old.plan, new.plan, finished)
    print(render(old, new, d))
    return EXIT_OK if d.same else EXIT_DIFFERENT


if __name__ == "__main__":
    sys.exit(main())
