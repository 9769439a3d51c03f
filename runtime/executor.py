"""Runs a Plan: each stage in order, skipping what is already done, never half-finishing one.

For every stage the executor decides (compiler/state.py) whether to create, rebuild, resume
or reuse it; prepares its directory (a rebuilt stage's old output is moved aside, not
deleted); writes STARTED.json; calls the handler `runtime/stages/<kind>.py: run(ctx)`; then
writes MANIFEST.json (with the summary the handler returned, as its kind declares it:
compiler/specs/outputs.py) and, last, COMPLETED. A crash or a kill at any moment leaves
either a finished stage or one the next run redoes (training stages continue from
checkpoints).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import sys
import time
import traceback
from typing import Sequence

# TensorFlow's C++ start-up chatter (oneDNN, CUDA probing) drowns the progress lines; a user
# who wants it sets TF_CPP_MIN_LOG_LEVEL themselves. Must be set before TensorFlow loads.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from runexp.compiler import uris  # noqa: E402
from runexp.compiler.errors import UserError
from runexp.compiler.exit_codes import (EXIT_INTERRUPTED, EXIT_OK, EXIT_STAGE_FAILED,
                                        EXIT_USER_ERROR)
from runexp.compiler.kinds import KINDS, TF_KINDS, TRAINING_KINDS, read_summary
from runexp.compiler.plan import COMPLETED_FILE, MANIFEST_FILE, Plan, Stage
from runexp.compiler.render import STYLES, SYMBOLS
from runexp.compiler.selection import select
from runexp.compiler.specs.outputs import Summary
from runexp.compiler.state import (CREATE, REBUILD, RESUME, REUSE, SKIP, STARTED_FILE,
                                   StageState, plan_states)
from runexp.compiler.terminal import highlight, paint
from runexp.runtime.context import StageContext
from runexp.compiler import wall_time
from runexp.compiler.model_sizes import parameter_count
from runexp.compiler.state import stage_state
from runexp.runtime import cluster, storage
from runexp.runtime.gcs_mirror import Mirror
from runexp.runtime.run_lock import LockHeld, RunLock

SUPERSEDED_DIR = ".superseded"
# Absolute time (time.time()) by which training stops with a checkpoint; set by the CLI from
# experiment.wall_time_hours at the first launch, so relaunches share one budget.
DEADLINE_ENV = "RUNEXP_DEADLINE_UNIX"
# Set (the tests set it): a handler's summary key its kind does not declare raises; unset,
# it is written and warned about (a finished stage is not failed for a bookkeeping slip).
STRICT_SUMMARIES_ENV = "RUNEXP_STRICT_SUMMARIES"


def _say(message: str) -> None:
    print(message, flush=True)


def _json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)


def _prepare_dir(stage: Stage, state: StageState, root: str) -> None:
    d = stage.output_dir
    if state.action == REBUILD and os.path.isdir(d):
        # Keep the old output: a rebuild must not lose a finished result.
        old_fp = ""
        try:
            with open(os.path.join(d, MANIFEST_FILE), encoding="utf-8") as f:
                old_fp = json.load(f).get("fingerprint", "")[:12]
        except (OSError, ValueError):
            pass
        aside = os.path.join(root, SUPERSEDED_DIR, f"{stage.id}-{old_fp or 'unknown'}-"
                                                    f"{time.strftime('%Y%m%d-%H%M%S')}")
        os.makedirs(os.path.dirname(aside), exist_ok=True)
        os.replace(d, aside)
        _say(f"    the previous output was moved to {aside}")
    elif state.action == CREATE and os.path.isdir(d):
        shutil.rmtree(d)  # partial output of an attempt that never finished
    elif state.action == RESUME:
        # A finished run being continued is no longer finished.
        for name in (COMPLETED_FILE, MANIFEST_FILE):
            if os.path.exists(os.path.join(d, name)):
                os.remove(os.path.join(d, name))
    os.makedirs(d, exist_ok=True)


def _headline(stage: Stage, summary: dict) -> str:
    parts = []
    flat = {}
    for key, value in summary.items():  # one level of nesting: per-split counts
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    for key, value in flat.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        elif isinstance(value, (int, str)) and len(str(value)) < 60:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def declared_summary(kind: str, returned) -> dict:
    """The summary a handler returned, as MANIFEST.json holds it: a record's dict, or a dict
    checked against the kind's record (compiler/specs/outputs.py)."""
    record = KINDS[kind].summary
    if isinstance(returned, Summary):
        if not isinstance(returned, record):
            raise TypeError(f"the {kind} handler returned a {type(returned).__name__}, not a "
                            f"{record.__name__}")
        return returned.to_dict()
    summary = dict(returned or {})
    wrong = record.undeclared(summary)
    if wrong:
        message = (f"the {kind} handler's summary has keys {record.__name__} does not declare: "
                   f"{', '.join(wrong)} (declare them in compiler/specs/)")
        if os.environ.get(STRICT_SUMMARIES_ENV):
            raise ValueError(message)
        _say(f"    WARNING: {message}")
    return summary


def _started_record(stage: Stage) -> dict:
    return {"fingerprint": stage.fingerprint, "resume_key": stage.resume_key,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _manifest(stage: Stage, summary: dict, seconds: float) -> dict:
    return {"stage": stage.id, "kind": stage.kind, "fingerprint": stage.fingerprint,
            "resume_key": stage.resume_key, "params": dict(stage.params),
            "inputs": dict(stage.inputs), "summary": summary, "seconds": round(seconds, 2),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            # the gs:// objects the stage was planned from: a later dry run names what changed
            **({"input_objects": dict(stage.input_objects)} if stage.input_objects else {})}


def _deadline_margin_s(plan: Plan, stage: Stage) -> float | None:
    """Seconds a training stage keeps free before the deadline: the plan's
    wall_time_margin_minutes, else the automatic margin of its budget and model size
    (compiler/wall_time.py, the numbers the plan shows); None without a budget in the plan."""

    launch = plan.launch or {}
    minutes, hours = launch.get("wall_time_margin_minutes"), launch.get("wall_time_hours")
    if minutes is None and not hours:
        return None

    try:
        parameters = parameter_count(stage.params["model"])
    except (KeyError, TypeError):
        parameters = None  # the size term is left out
    return wall_time.margin_s(float(hours or 0) * 3600, parameters, minutes)


def run_stage(plan: Plan, stage: Stage, state: StageState, mirror=None) -> dict:
    """Runs one stage to completion (COMPLETED written) and returns its summary.

    With a `mirror` (gs:// output root) the handler works on local copies and its outputs are
    uploaded and verified before MANIFEST.json and COMPLETED are written remotely.
    """

    handler = importlib.import_module(f"runexp.runtime.stages.{stage.kind}")
    start = time.time()
    if mirror is None:
        _prepare_dir(stage, state, plan.output_root)
    else:
        # First of all the stage must stop looking done; its old files stay until replaced.
        for name in (COMPLETED_FILE, MANIFEST_FILE):
            storage.delete(storage.join(stage.output_dir, name), missing_ok=True)
    storage.write_text(storage.join(stage.output_dir, STARTED_FILE),
                       _json(_started_record(stage)))
    view = stage  # what the handler sees: local paths, and the run's deadline if any
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline and stage.kind in TRAINING_KINDS:
        view = dataclasses.replace(view, params={
            **view.params, "deadline_unix": float(deadline),
            "deadline_margin_s": _deadline_margin_s(plan, stage)})
    # Inputs the handler reads on gs:// itself (a Beam pipeline's workers read the corpus).
    in_place = tuple(getattr(handler, "inputs_read_in_place", lambda s: ())(stage))
    if mirror is None:
        if any(uris.is_gcs(v) for v in uris.strings_in(view.inputs)):
            # A local root reading gs:// inputs (a corpus, a vocab, a released checkpoint):
            # downloaded into the input cache in the listed versions, like a gs:// root's.

            view = Mirror(plan).local_inputs(view, in_place)
        ctx = StageContext(stage=view, plan=plan, work_dir=stage.output_dir)
    else:
        local = mirror.local_stage(view, resume=state.action == RESUME, in_place=in_place)
        ctx = StageContext(stage=local, plan=plan, work_dir=local.output_dir,
                           sync=mirror.stage_sync(stage, local.output_dir))
    summary = declared_summary(stage.kind, handler.run(ctx))
    ctx.sync()  # after the checkpoint upload in flight, if any
    storage.write_text(storage.join(stage.output_dir, MANIFEST_FILE),
                       _json(_manifest(stage, summary, time.time() - start)))
    storage.write_text(storage.join(stage.output_dir, COMPLETED_FILE), stage.fingerprint + "\n")
    if mirror is not None:
        mirror.finish(stage, ctx.work_dir)
    return summary


def _read_summary(stage: Stage) -> dict:
    try:
        manifest = json.loads(storage.read_text(storage.join(stage.output_dir, MANIFEST_FILE)))
    except (OSError, ValueError, storage.StorageError):
        return {}
    return manifest.get("summary") or {} if isinstance(manifest, dict) else {}


def _results(plan: Plan, summaries: dict) -> list[str]:
    """The console's closing lines: each stage's directory, then the headline scores of the
    summaries (stage id -> MANIFEST summary) as their kinds declare them."""
    lines = ["", "Results:"]
    for stage in plan.stages:
        lines.append(f"  {stage.id:<28} {stage.output_dir}")
    got = {s.id: read_summary(s.kind, summaries[s.id]) for s in plan.stages
           if s.id in summaries}
    ev = got.get("evaluate")
    if ev and ev.mlm_accuracy is not None:
        baseline = ev.majority_token_accuracy
        lines.append(f"  held-out MLM accuracy {ev.mlm_accuracy:.3f} (always predicting the "
                     f"most frequent token: "
                     f"{float('nan') if baseline is None else baseline:.3f})"
                     + (f", NSP accuracy {ev.nsp_accuracy:.3f}"
                        if ev.nsp_accuracy is not None else ""))
    for stage in plan.stages:
        s = got.get(stage.id)
        if stage.kind != "finetune" or s is None:
            continue
        names = s.scored_by  # the task's metrics (older runs: accuracy)
        for name, scores in s.dev_scores().items():
            label = "dev" if name == "dev" else f"dev set {name}:"
            values = ", ".join(f"{m} {scores.values[m]:.3f}" for m in names
                               if m in scores.values)
            baseline = (f" (majority class: {scores.majority_baseline:.3f})"
                        if scores.majority_baseline is not None else "")
            lines.append(f"  {stage.id}: {label} {values}{baseline}")
    for stage in plan.stages:  # a fine-tuning sweep: its selection (runtime/stages/sweep.py)
        s = got.get(stage.id)
        if stage.kind == "sweep" and s is not None and s.selected is not None:
            spread = f" ± {s.std:.3f}" if s.std is not None else ""
            lines.append(f"  {stage.id}: selected {s.selected} (dev {s.metric} "
                         f"{s.mean:.3f}{spread} over its seeds) of {s.points} "
                         f"points; exported {s.exported}; the grid: "
                         f"{stage.id}/sweep.json, grid.png")
    suite = got.get("suite")
    if suite and suite.glue_average is not None:
        lines.append(f"  GLUE average {suite.glue_average:.3f} over "
                     f"{', '.join(suite.glue_tasks)} (WNLI left out; suite/suite.json)")
    return lines


def _load_tensorflow_quietly(accelerator: dict, multi_worker: bool = False) -> None:
    """Imports TensorFlow with its C++ start-up lines (written before its logging is set up,
    so TF_CPP_MIN_LOG_LEVEL cannot silence them) captured; on a CPU run they only say that no
    GPU was found. They are shown if the import fails."""
    if multi_worker:
        from runexp.runtime.strategy import make_strategy

        make_strategy(accelerator)  # made once per process, before TensorFlow runs an op
        return
    if accelerator.get("type", "cpu") != "cpu" or "tensorflow" in sys.modules:
        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            import tensorflow as tf

            replicas = int(accelerator.get("replicas", 1))
            if replicas > 1:  # the cpu_x8 test profile: split before TF starts its devices
                from runexp.runtime.strategy import split_cpu

                split_cpu(replicas)
            tf.config.list_logical_devices()  # device start-up logs now, not mid-run
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _confine(plan: Plan) -> None:
    """Refuses, before anything is written, a plan that would write outside its output root:
    a stage directory with ``..`` segments, or behind (or holding) a symlink leading out."""

    for name in ("plan.json", "operative_config.gin"):
        storage.confined(plan.output_root, uris.join(plan.output_root, name))
    for stage in plan.stages:
        # The id names the stage's directory, here and in a gs:// run's local cache.
        storage.confined(plan.output_root, uris.join(plan.output_root, stage.id))
        storage.confined(plan.output_root, stage.output_dir)


# How often a non-chief worker looks whether the chief finished a stage it needs.
WORKER_POLL_SECONDS = 2.0


def _wait_until_done(stages, what: str) -> None:
    """Blocks until every stage in `stages` is finished (COMPLETED, same fingerprint)."""

    waited, said = 0.0, -60.0
    for stage in stages:
        while stage_state(stage, {}).action != REUSE:
            if waited - said >= 60.0:
                _say(f"    waiting for the chief to finish {stage.id} ({what})")
                said = waited
            time.sleep(WORKER_POLL_SECONDS)
            waited += WORKER_POLL_SECONDS


def _run_as_worker(plan: Plan) -> int:
    """A non-chief member of a multi-worker run (runtime/cluster.py): joins each training
    stage the chief runs, in a private directory; writes nothing under the output root."""
    import tempfile

    _say(f"runexp: {cluster.worker_name()} of a multi-worker run on {plan.output_root}: the "
         "chief builds and writes everything; this worker joins the training stages")
    mirror = None
    if uris.is_gcs(plan.output_root):
        mirror = Mirror(plan)
    by_id = {s.id: s for s in plan.stages}
    for stage in plan.stages:
        if stage.kind not in TRAINING_KINDS:
            continue
        if stage_state(stage, {}).action == REUSE:
            _say(f"  {stage.id}: finished earlier, nothing to join")
            continue
        _wait_until_done([by_id[d] for d in stage.deps], f"before {stage.id}")
        _say(f"  {stage.id}: joining")
        _load_tensorflow_quietly(plan.accelerator)
        handler = importlib.import_module(f"runexp.runtime.stages.{stage.kind}")
        private = tempfile.mkdtemp(prefix=f"runexp-worker-{stage.id}-")
        view = stage
        if mirror is not None:  # upstream outputs as local copies, read-only
            view = mirror.local_inputs(stage)
        try:
            handler.run(StageContext(stage=view, plan=plan, work_dir=private))
        except UserError as e:
            print(highlight(f"error in stage {stage.id}:\n{e.render()}"), file=sys.stderr)
            return EXIT_USER_ERROR
        finally:
            shutil.rmtree(private, ignore_errors=True)
    _say("Worker finished.")
    return EXIT_OK


def run_plan(plan: Plan, until: Sequence[str] = (), only: Sequence[str] = ()) -> int:
    """Runs every stage of `plan` that is not already done (of those ``--until``/``--only``
    select: compiler/selection.py). Returns an exit code."""

    try:
        _confine(plan)
    except storage.OutsideRootError as e:
        print(f"error: {e}\n  nothing was written", file=sys.stderr)
        return EXIT_USER_ERROR
    if cluster.is_multi_worker():
        # TensorFlow sets up the cluster's collectives only before it runs anything.
        _load_tensorflow_quietly(plan.accelerator, multi_worker=True)
    if not cluster.is_chief():
        return _run_as_worker(plan)

    try:
        lock = RunLock.acquire(plan.output_root, command=" ".join(sys.argv))
    except LockHeld as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        return _run_stages(plan, until, only, lock)
    finally:
        lock.release()


def _run_stages(plan: Plan, until: Sequence[str], only: Sequence[str], lock) -> int:
    """run_plan's body, with the root's lock held."""
    mirror = _prepare_root(plan)
    try:
        states = select(plan, plan_states(plan), until, only)
    except UserError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_USER_ERROR
    _say(f"runexp: experiment {plan.experiment!r}, {len(plan.stages)} stages -> "
         f"{plan.output_root}")
    summaries: dict[str, dict] = {}
    started = time.time()
    for i, stage in enumerate(plan.stages, 1):
        state = states[stage.id]
        head = (f"[{i}/{len(plan.stages)}] "
                f"{paint(SYMBOLS[state.action], STYLES[state.action])} {stage.id}")
        if state.action == REUSE:
            summaries[stage.id] = _read_summary(stage)
            _say(f"{head}: reused ({state.reason})")
            continue
        if state.action == SKIP:
            _say(f"{head}: {state.reason}")
            continue
        lock.set_stage(stage.id)
        verb = {CREATE: "creating", REBUILD: "rebuilding", RESUME: "resuming"}[state.action]
        _say(f"{head}: {verb} ({state.reason})")
        t0 = time.time()
        summary, exit_code = _run_one(plan, stage, state, mirror)
        if exit_code is not None:
            return exit_code
        summaries[stage.id] = summary
        _say(f"    done in {time.time() - t0:.1f} s: {_headline(stage, summary)}")
    for line in _results(plan, summaries):
        _say(line)
    skipped = [s for s in plan.stages if states[s.id].action == SKIP]
    _say(f"Finished in {time.time() - started:.1f} s." + (
        f" {len(skipped)} stage(s) skipped as asked ({', '.join(s.id for s in skipped)}): "
        "run without --until/--only to go on." if skipped else ""))
    return EXIT_OK


def _prepare_root(plan: Plan):
    """Writes the truth next to the results (the exact plan and the values it was compiled
    from); returns the GCS mirror of a gs:// root, or None for a local one."""

    mirror = None
    if uris.is_gcs(plan.output_root):
        mirror = Mirror(plan)
    else:
        os.makedirs(plan.output_root, exist_ok=True)
    storage.write_text(uris.join(plan.output_root, "plan.json"), plan.to_json())
    storage.write_text(uris.join(plan.output_root, "operative_config.gin"),
                       plan.operative_config)
    return mirror


def _run_one(plan: Plan, stage, state, mirror) -> tuple[dict | None, int | None]:
    """Runs one stage: (its summary, None), or (None, the exit code) after saying why it
    stopped. Finished stages are kept whatever happens here."""

    try:
        if stage.kind in TF_KINDS:
            _load_tensorflow_quietly(plan.accelerator)
        return run_stage(plan, stage, state, mirror), None
    except UserError as e:
        print(highlight(f"error in stage {stage.id}:\n{e.render()}"), file=sys.stderr)
        return None, EXIT_USER_ERROR
    except storage.StorageError as e:
        print(f"error in stage {stage.id}: {e}\n  hint: finished stages are kept; check "
              "the bucket and your access, then run the same command again",
              file=sys.stderr)
        return None, EXIT_STAGE_FAILED
    except KeyboardInterrupt:
        print(f"\ninterrupted in stage {stage.id}: finished stages are kept; run the same "
              "command again to continue", file=sys.stderr)
        return None, EXIT_INTERRUPTED
    except Exception as e:
        preemption = sys.modules.get("runexp.runtime.preemption")
        if preemption is not None and isinstance(e, preemption.Preempted):
            print(f"stage {stage.id} stopped: {e}. Run the same command again to "
                  "continue from that checkpoint.", file=sys.stderr)
            return None, e.exit_code
        # A bug or an environment failure, not the user's input.
        traceback.print_exc()
        print(f"\nstage {stage.id} failed (see above). Finished stages are kept; the "
              "failed stage is redone by the next run.", file=sys.stderr)
        return None, EXIT_STAGE_FAILED
