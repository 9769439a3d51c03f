"""The `runexp` command: compile gin files into a plan, print it, or run it.

    runexp --gin_file=quickstart.gin --dry_run        # print the plan, start nothing
    runexp --gin_file=quickstart.gin                  # run it
    runexp --gin_file=quickstart.gin --explain=TRAIN_STEPS
    runexp status runexp_output/quickstart           # how an experiment stands (--json)
    runexp --gin_file=exp.gin --until=preprocess     # run part of a plan (also --only=A,B)
    runexp inspect --gin_file=quickstart.gin -n 3    # decoded pretraining examples
    runexp report runexp_output/quickstart           # an HTML report with the curves
    runexp diff quickstart.gin mine.gin              # what differs, what NEW would rebuild

t5x's flag spellings are accepted too: --gin.NAME=VALUE, --gin_bindings, --gin_search_paths.

Exit codes (stable; scripts may branch on them):
    0  success (a dry run: nothing to do)
    1  user error: bad gin, bad flags, bad input data; the message says file, line, what to do
    2  a dry run found work to do (stages to create, rebuild or resume)
    3  a stage failed while running (the message names the stage; finished stages are kept)
    4  `runexp diff`: the two experiments differ
    75 preempted (SIGTERM): training checkpointed at the step reached; a rerun continues
       (with experiment.max_attempts > 1, runexp relaunches itself)
    124 the wall-time budget (experiment.wall_time_hours) ran out after a checkpoint
    130 interrupted (Ctrl-C); finished stages are kept, a rerun continues
This module imports neither TensorFlow nor seqio: the runtime is imported only to run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from runexp.compiler.arguments import ArgumentParser
from runexp.compiler.exit_codes import EXIT_OK, EXIT_PENDING, EXIT_USER_ERROR
from runexp.compiler.terminal import highlight
from runexp.compiler.errors import Location, Problem, UserError, did_you_mean
from runexp.compiler.estimates import estimates
from runexp.compiler.gcs_inputs import OFFLINE, SKIP_ENV
from runexp.compiler.plan import Plan
from runexp.compiler.planner import compile_experiment
from runexp.compiler.preflight import errors as preflight_errors, preflight
from runexp.compiler.render import render_plan
from runexp.compiler.schema import CONFIGURABLES
from runexp.compiler.selection import select
from runexp.compiler.state import REUSE, SKIP, plan_states, stage_state

DEADLINE_ENV = "RUNEXP_DEADLINE_UNIX"  # read by the executor
CHILD_ENV = "RUNEXP_RELAUNCHED_CHILD"  # set in children of the relaunch loop


SUBCOMMANDS = """subcommands:
  runexp status ROOT [--json]    how the experiment in ROOT stands; a live run's step, loss, ETA
                                 e.g. runexp status runexp_output/quickstart
  runexp inspect --gin_file=F    decoded pretraining examples of a preprocessed task
                                 e.g. runexp inspect --gin_file=quickstart.gin -n 3
  runexp report ROOT             a self-contained HTML report: plan, times, metrics, curves
                                 e.g. runexp report runexp_output/quickstart
  runexp diff OLD NEW            what differs between two experiments (gin files or output
                                 roots), what NEW would rebuild, metrics side by side
  runexp unlock ROOT [--force]   remove the lock a run that is gone left in ROOT

t5x spellings are accepted: --gin.NAME=VALUE (as --gin_param=NAME=VALUE), --gin_bindings
(as --gin_param), --gin_search_paths=A,B (as --gin_search_path).

exit codes: 0 ok, 1 user error, 2 dry run with work pending, 3 stage failed, 4 runexp diff
  found differences, 75 preempted, 124 wall-time budget spent, 130 interrupted."""


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("runexp")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _t5x_aliases(argv: Sequence[str]) -> list[str]:
    """t5x's spellings of the gin flags, as runexp's own (module docstring)."""
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in ("--gin_bindings", "--gin_search_paths") and not eq and i + 1 < len(args):
            value, eq = args[i + 1], "="
            i += 1
        if name.startswith("--gin.") and eq:
            out.append(f"--gin_param={name[len('--gin.'):]}={value}")
        elif name == "--gin_bindings" and eq:
            out.append(f"--gin_param={value}")
        elif name == "--gin_search_paths" and eq:
            out.extend(f"--gin_search_path={p}" for p in value.split(",") if p)
        else:
            out.append(arg)
        i += 1
    return out


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="runexp", allow_abbrev=False,
                formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Compile a BERT experiment written in gin into a plan, review it, "
                            "and run it.\n\n  runexp --gin_file=quickstart.gin --dry_run\n"
                            "  runexp --gin_file=quickstart.gin",
                epilog=SUBCOMMANDS)
    p.add_argument("--version", action="version", version=f"runexp {_version()}")
    p.add_argument("--gin_file", action="append", default=[], metavar="FILE",
                   help="gin file (repeatable; later files override earlier ones). Looked up "
                        "as given, then in --gin_search_path, then in runexp's own gin/ folder")
    p.add_argument("--gin_param", action="append", default=[], metavar="BINDING",
                   help="gin binding applied after the files, e.g. TRAIN_STEPS=200 (repeatable)")
    p.add_argument("--gin_search_path", action="append", default=[], metavar="DIR",
                   help="directory to look for gin files and includes in (repeatable)")
    p.add_argument("--dry_run", action="store_true",
                   help="print the plan and exit: nothing is executed or written")
    p.add_argument("--explain", action="append", default=[], metavar="NAME",
                   help="print where a value comes from: a MACRO or configurable.param "
                        "(scope/configurable.param for a task); repeatable")
    p.add_argument("--offline", action="store_true",
                   help="with --dry_run: plan without asking Cloud Storage (no listing of "
                        "gs:// inputs, no preflight); changes to gs:// inputs go unseen")
    p.add_argument("--until", action="append", default=[], metavar="STAGE",
                   help="run STAGE and the stages it needs, nothing after (a stage id, or a "
                        "kind such as preprocess for all its stages)")
    p.add_argument("--only", action="append", default=[], metavar="STAGE[,STAGE]",
                   help="run exactly these stages; the stages they read must be finished")
    p.add_argument("--plan_format", choices=("text", "json"), default="text",
                   help="how --dry_run prints the plan")
    p.add_argument("--plan_out", metavar="FILE", help="also save the plan as JSON to FILE")
    p.add_argument("--plan_file", metavar="FILE",
                   help="run (or with --dry_run, show) exactly this saved plan; refused if any "
                        "input or gin file changed since it was saved")
    return p


def _explain(compiled, names: Sequence[str]) -> tuple[str, bool]:
    out, ok = [], True
    for name in names:
        if "." not in name:
            prov = compiled.resolver.macro(name)
            if prov is None:
                out.append(f"{name}: no such macro ("
                           f"{did_you_mean(name, compiled.resolver.config.macros)})")
                ok = False
            else:
                out.append(prov.explain())
            continue
        scope, _, rest = name.rpartition("/")
        configurable, _, param = rest.partition(".")
        spec = CONFIGURABLES.get(configurable)
        if spec is None or param not in spec.params:
            candidates = [f"{c}.{p}" for c, s in CONFIGURABLES.items() for p in s.params]
            out.append(f"{name}: unknown ({did_you_mean(rest, candidates)})")
            ok = False
            continue
        out.append(compiled.resolver.provenance(configurable, param, scope).explain())
    return "\n".join(out), ok


def _load_saved_plan(path: str):
    """Reads a --plan_out file and checks that compiling its sources again gives the same plan."""

    try:
        with open(path, encoding="utf-8") as f:
            plan = Plan.from_json(f.read())
    except OSError as e:
        raise UserError(Problem(f"cannot read the plan file: {e.strerror}", Location(path)))
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(Problem(f"not a runexp plan: {e}", Location(path),
                                hint="save one with --dry_run --plan_out=FILE"))
    try:
        again = compile_experiment(plan.gin_files, plan.gin_params, plan.gin_search_paths).plan
    except UserError as e:
        raise UserError([Problem("the saved plan no longer compiles from its gin files:",
                                 Location(path))] + e.problems)
    before = {s.id: s.fingerprint for s in plan.stages}
    now = {s.id: s.fingerprint for s in again.stages}
    changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if changed:
        raise UserError(Problem(
            "the world changed since this plan was saved: stage(s) " + ", ".join(changed)
            + " would now be built from different inputs or settings", Location(path),
            hint="review a fresh plan (--dry_run --plan_out=FILE) and run that one"))
    return plan


def _status(argv: Sequence[str]) -> int:
    """`runexp status OUTPUT_ROOT [--json]`: each stage of the experiment saved there, how it
    stands, and a live run's progress (runtime/status.py)."""
    import json

    from runexp.runtime import status

    p = ArgumentParser(prog="runexp status", allow_abbrev=False,
                description="Show how the experiment in OUTPUT_ROOT stands, stage by stage; "
                            "for a live run its stage, step, loss, rate and ETA.")
    p.add_argument("output_root", help="the experiment's OUTPUT_ROOT (local path or gs://)")
    p.add_argument("--json", action="store_true", help="print it as JSON, for scripts")
    args = p.parse_args(argv)
    root = args.output_root.rstrip("/")
    read = _reader(root)
    text = read(f"{root}/plan.json")
    if text is None:
        print(f"error: {root} holds no runexp experiment (no plan.json)\n"
              "  hint: give the OUTPUT_ROOT of an experiment that has been run", file=sys.stderr)
        return EXIT_USER_ERROR
    report = status.status(Plan.from_json(text), read)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else status.render(report))
    return EXIT_OK if report["done"] == len(report["stages"]) else EXIT_PENDING


def _unlock(argv: Sequence[str]) -> int:
    """`runexp unlock OUTPUT_ROOT [--force]`: remove the lock of a run that is gone."""
    from runexp.runtime import run_lock

    p = ArgumentParser(prog="runexp unlock", allow_abbrev=False,
                description="Remove the lock a run left in OUTPUT_ROOT (runs take over a stale "
                            "lock by themselves; this is for the impatient).")
    p.add_argument("output_root")
    p.add_argument("--force", action="store_true",
                   help="remove it even if its heartbeat is recent (only if that run is "
                        "certainly gone)")
    args = p.parse_args(argv)
    try:
        print(run_lock.break_lock(args.output_root.rstrip("/"), force=args.force))
    except run_lock.LockHeld as e:
        print(f"error: {e}\n  (--force removes it anyway)", file=sys.stderr)
        return EXIT_USER_ERROR
    return EXIT_OK


def _inspect(argv: Sequence[str]) -> int:
    """`runexp inspect --gin_file=... [--task=NAME] [-n 5]`: decoded pretraining examples."""

    p = ArgumentParser(prog="runexp inspect", allow_abbrev=False,
                description="Decode examples of a preprocessed pretraining task: masked "
                            "positions marked [MASK→orig], {random→orig}, <kept>.")
    p.add_argument("--gin_file", action="append", default=[], metavar="FILE")
    p.add_argument("--gin_param", action="append", default=[], metavar="BINDING")
    p.add_argument("--gin_search_path", action="append", default=[], metavar="DIR")
    p.add_argument("--task", help="bert_pretraining_task name (default: the one train.task uses)")
    p.add_argument("--phase", type=int, default=1,
                   help="the pretraining phase whose examples to show (train.phases; default 1)")
    p.add_argument("--split", default="train", choices=("train", "validation"))
    p.add_argument("-n", type=int, default=5, help="examples to show")
    args = p.parse_args(argv)
    try:
        plan = compile_experiment(args.gin_file, args.gin_param, args.gin_search_path).plan
    except UserError as e:
        print(highlight(e.render()), file=sys.stderr)
        return EXIT_USER_ERROR
    suffix = "" if args.phase == 1 else f".phase{args.phase}"  # compiler/stages/phases.py
    pre = [s for s in plan.stages if s.kind == "preprocess"
           and s.id == f"preprocess.{s.params['task']}{suffix}"]
    stage = next((s for s in pre if s.params["task"] == args.task), None) if args.task else \
        (pre[0] if pre else None)
    if stage is None:
        tasks = sorted({s.params["task"] for s in plan.stages if s.kind == "preprocess"})
        phases = sum(1 for s in plan.stages if s.kind == "pretrain")
        print("error: no preprocess stage " + (f"for task {args.task!r} " if args.task else "")
              + (f"in phase {args.phase} " if args.phase != 1 else "") + "in this experiment\n"
              f"  hint: tasks planned: {', '.join(tasks) or 'none'}"
              + (f"; phases: 1 to {phases}" if phases > 1 else ""), file=sys.stderr)
        return EXIT_USER_ERROR
    vocab = plan.stage("vocab")
    if stage_state(stage, {}).action != REUSE or stage_state(vocab, {}).action != REUSE:
        print(f"error: stage {stage.id} is not built (or is out of date) in {plan.output_root}\n"
              "  hint: run the experiment first: runexp " + " ".join(
                  f"--gin_file={f}" for f in args.gin_file), file=sys.stderr)
        return EXIT_USER_ERROR
    data_dir, vocab_dir = stage.output_dir, vocab.output_dir
    if plan.output_root.startswith("gs://"):
        from runexp.runtime.gcs_mirror import Mirror

        mirror = Mirror(plan)
        data_dir, vocab_dir = mirror.pull(stage), mirror.pull(vocab)
    from runexp.tasks.cache.inspect import inspect_examples  # light: numpy, no TensorFlow

    print(inspect_examples(data_dir, vocab_dir, args.split, args.n))
    return EXIT_OK


def _reader(root: str):
    if root.startswith("gs://"):
        from runexp.runtime import storage

        def read(uri):
            try:
                return storage.read_text(uri)
            except (OSError, storage.StorageError):
                return None
        return read

    def read_local(path):
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError:
            return None
    return read_local


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = _t5x_aliases(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["status"]:
            return _status(argv[1:])
        if argv[:1] == ["inspect"]:
            return _inspect(argv[1:])
        if argv[:1] == ["unlock"]:
            return _unlock(argv[1:])
        if argv[:1] == ["diff"]:
            from runexp.compiler.diff import main as diff_main  # no TensorFlow

            return diff_main(argv[1:])
        if argv[:1] == ["report"]:
            from runexp.runtime.report.command import main as report_main  # no TensorFlow

            return report_main(argv[1:])
        return _main(argv)
    except BrokenPipeError:  # `runexp ... --dry_run | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.offline:
        if not args.dry_run:
            print("error: --offline only plans (the run needs storage)\n  hint: add "
                  "--dry_run, or drop --offline", file=sys.stderr)
            return EXIT_USER_ERROR
        import os

        os.environ[SKIP_ENV] = OFFLINE

    try:
        if args.plan_file:
            if args.gin_file or args.gin_param or args.explain:
                raise UserError("--plan_file runs a saved plan as it is: it takes no --gin_file, "
                                "--gin_param or --explain")
            compiled = None
            plan = _load_saved_plan(args.plan_file)
        else:
            compiled = compile_experiment(args.gin_file, args.gin_param, args.gin_search_path)
            plan = compiled.plan
    except UserError as e:
        print(highlight(e.render()), file=sys.stderr)
        return EXIT_USER_ERROR
    if args.explain and compiled is not None:
        text, ok = _explain(compiled, args.explain)
        print(text)
        return EXIT_OK if ok else EXIT_USER_ERROR
    if args.plan_out:
        try:
            with open(args.plan_out, "w", encoding="utf-8") as f:
                f.write(plan.to_json())
        except OSError as e:
            print(f"error: cannot write --plan_out {args.plan_out!r}: {e.strerror}",
                  file=sys.stderr)
            return EXIT_USER_ERROR

    try:
        states = select(plan, plan_states(plan, offline=args.offline), args.until, args.only)
    except UserError as e:
        print(highlight(e.render()), file=sys.stderr)
        return EXIT_USER_ERROR

    findings = preflight(plan, offline=args.offline)
    problems = preflight_errors(findings)
    if args.dry_run:
        if args.plan_format == "json":
            import dataclasses
            import json

            d = plan.to_dict()
            d["actions"] = {k: {"action": s.action, "reason": s.reason} for k, s in states.items()}
            d["estimates"] = {k: dataclasses.asdict(e) for k, e in estimates(plan).items()}
            d["preflight"] = findings
            print(json.dumps(d, indent=2, sort_keys=True))
        else:
            print(render_plan(plan, states, dry_run=True, preflight=findings))
        if problems:
            print(f"error: preflight found {len(problems)} problem(s) (listed under "
                  "Preflight above): fix them before running", file=sys.stderr)
            return EXIT_USER_ERROR
        pending = any(s.action not in (REUSE, SKIP) for s in states.values())
        return EXIT_PENDING if pending else EXIT_OK

    for w in plan.warnings:
        print(w, file=sys.stderr)
    if problems:  # before anything is written
        print("error: preflight found problem(s) with where this plan reads and writes:\n  "
              + "\n  ".join(problems) + "\n  hint: fix them, then run the same command again "
              "(`--dry_run` shows every check)", file=sys.stderr)
        return EXIT_USER_ERROR
    for finding in findings:
        if finding.startswith(("WARNING:", "skipped:")):
            print(f"preflight: {finding}", file=sys.stderr)
    return _launch(plan, argv, args.until, args.only)


def _launch(plan, argv: Sequence[str], until: Sequence[str] = (),
            only: Sequence[str] = ()) -> int:
    """Runs the plan here, or, with experiment.max_attempts > 1, in child processes relaunched
    after each preemption. A wall-time budget becomes one deadline shared by all attempts."""
    import os
    import time

    launch = plan.launch or {}
    hours = launch.get("wall_time_hours")
    if hours and not os.environ.get(DEADLINE_ENV):
        os.environ[DEADLINE_ENV] = str(time.time() + hours * 3600)
    attempts = int(launch.get("max_attempts") or 1)
    if attempts > 1 and not os.environ.get(CHILD_ENV):
        from runexp.runtime.relaunch import run_with_relaunch  # standard library only

        os.environ[CHILD_ENV] = "1"
        return run_with_relaunch([sys.executable, "-m", "runexp.compiler.cli", *argv],
                                 attempts, float(launch.get("relaunch_backoff_s") or 0.0))
    from runexp.runtime.executor import run_plan  # TensorFlow is imported only from here on

    return run_plan(plan, until, only)


if __name__ == "__main__":
    sys.exit(main())
