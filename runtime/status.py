"""`runexp status ROOT`: how an experiment stands, for people and (``--json``) for machines.

Read from small files only (plan.json, each stage's MANIFEST.json, a training stage's
checkpoints, the root's RUN_LOCK.json) and the end of a training stage's train_log.jsonl
(runtime/log_reader.py: a block or two, however long the run): no TensorFlow, cheap on
gs://.

A run is *live* when the root's lock is (runtime/run_lock.py); the stage named in the lock is
then "running", and a training stage shows its last logged step, loss, rate and ETA. A stage
that is not done and not running says why it stopped (a wall-time stop, a preemption, an
earlier attempt that did not finish) and how to continue.
"""

from __future__ import annotations

import json
import time
from typing import Callable, Optional

from runexp.compiler.kinds import KINDS, TRAINING_KINDS
from runexp.compiler.packing import packing_of
from runexp.compiler.plan import MANIFEST_FILE, Plan
from runexp.compiler.render import PARTICIPLES, SYMBOLS
from runexp.compiler.state import REUSE, latest_checkpoint_step, plan_states
from runexp.runtime import log_reader, run_lock

Reader = Callable[[str], Optional[str]]


def _log_tail(stage, checkpoint_step: Optional[int]) -> tuple[Optional[dict], Optional[dict]]:
    """The train log's last metrics record and the wall-time stop of ``checkpoint_step``
    (None: none), read back from the log's end only as far as they can be."""
    last = stop = None
    src = log_reader.source(log_reader.log_path(stage.output_dir, log_reader.TRAIN_LOG))
    for r in log_reader.backward(src):
        if not log_reader.is_metrics(r):
            if stop is None and r.get("event") == "deadline_stop" \
                    and r.get("deadline_seconds_left") is not None:
                stop = r
        elif last is None:
            last = r
        if last is not None and (stop is not None or not checkpoint_step
                                 or (r.get("step") or 0) < checkpoint_step):
            break  # an earlier stop is at an earlier step than the checkpoint's
    return last, stop


def _training(plan: Plan, stage, live: bool) -> dict:
    """Step, loss, rate and ETA of a training stage from its log; its stop, if any."""
    spec = KINDS[stage.kind].spec.from_stage(stage)
    out: dict = {"train_steps": spec.train_steps}
    step = latest_checkpoint_step(stage.output_dir)
    out["checkpoint_step"] = step
    last, stop = _log_tail(stage, step)
    if last is not None:
        out.update(step=last.get("step"), loss=last.get("loss"),
                   examples_per_second=last.get("examples_per_second"),
                   logged_at=last.get("time"))
        # The log's rate counts instances (a packed row holds several): the ETA divides the
        # instances a step by it.
        packing = packing_of(plan, stage) if stage.kind == "pretrain" else None
        eps = last.get("examples_per_second")
        batch = packing.instances_per_step if packing is not None else spec.batch_size
        if live and eps and batch and out["train_steps"]:
            left = max(0, int(out["train_steps"]) - int(last.get("step") or 0))
            out["eta_seconds"] = round(left * float(batch) / float(eps))
    if stop is not None and step and stop.get("step") == step:
        out["stop"] = {"reason": "wall-time budget", "step": step,
                       "deadline_seconds_left": stop["deadline_seconds_left"]}
    return out


def status(plan: Plan, read: Reader) -> dict:
    """The experiment's state as a JSON-able dict (what ``--json`` prints)."""
    lock = run_lock.read(plan.output_root)
    live = lock is not None and run_lock.stale_reason(lock) is None
    states = plan_states(plan)
    stages = []
    for stage in plan.stages:
        st = states[stage.id]
        entry: dict = {"id": stage.id, "kind": stage.kind}
        if st.action == REUSE:
            manifest = json.loads(read(f"{stage.output_dir}/{MANIFEST_FILE}") or "{}")
            entry.update(state="done", seconds=manifest.get("seconds"),
                         finished=manifest.get("finished"))
        elif live and lock.get("stage") == stage.id:
            entry.update(state="running")
        else:
            entry.update(state="not done", next_run=st.action, reason=st.reason)
        if stage.kind in TRAINING_KINDS and st.action != REUSE:
            entry.update(_training(plan, stage, entry["state"] == "running"))
        stages.append(entry)
    out = {"experiment": plan.experiment, "output_root": plan.output_root,
           "stages": stages, "done": sum(s["state"] == "done" for s in stages),
           "running": None, "stale_lock": None}
    if live:
        out["running"] = {k: lock.get(k) for k in ("host", "pid", "started", "heartbeat",
                                                   "stage", "command")}
    elif lock is not None:
        out["stale_lock"] = {"reason": run_lock.stale_reason(lock), **{
            k: lock.get(k) for k in ("host", "pid", "started", "heartbeat", "stage")}}
    return out


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def render(report: dict) -> str:
    """``status(...)`` as text for people."""
    lines = [f"experiment {report['experiment']!r} in {report['output_root']}"]
    running = report["running"]
    if running:
        lines.append(f"  running now: {run_lock.describe(running)}; heartbeat "
                     f"{time.time() - float(running['heartbeat']):.0f} s ago")
    elif report["stale_lock"]:
        stale = report["stale_lock"]
        lines.append(f"  not running: the last run ({run_lock.describe(stale)}) ended without "
                     f"releasing its lock ({stale['reason']}); the next run takes it over")
    for s in report["stages"]:
        symbol = {"done": "=", "running": "*"}.get(s["state"]) or SYMBOLS[s["next_run"]]
        line = f"  {symbol} {s['id']:<28}"
        if s["state"] == "done":
            line += f" done in {s.get('seconds') or 0:.0f} s, {s.get('finished') or ''}"
        elif s["state"] == "running":
            line += " running"
            if s.get("step") is not None:
                line += f": step {s['step']:,} of {s.get('train_steps') or '?':,}"
                if s.get("loss") is not None:
                    line += f", loss {s['loss']:.3f}"
                if s.get("examples_per_second"):
                    line += f", {s['examples_per_second']:,.0f} examples/s"
                if s.get("eta_seconds") is not None:
                    line += f", ETA {_eta(s['eta_seconds'])}"
        else:
            step = s.get("checkpoint_step")
            line += " not done" + (f" (latest checkpoint: step {step} of "
                                   f"{s.get('train_steps')})" if step else "")
            line += f": will be {PARTICIPLES[s['next_run']]} ({s['reason']})"
            stop = s.get("stop")
            if stop:
                left = stop["deadline_seconds_left"]
                line += (f"\n      stopped at the wall-time budget: the checkpoint of step "
                         f"{stop['step']} was complete {abs(left):.0f} s "
                         f"{'before' if left >= 0 else 'AFTER'} the deadline; run the same "
                         "command again to continue")
            elif step and not running:
                line += "\n      stopped before the end (preempted, interrupted or failed): " \
                        "run the same command again to continue from that checkpoint"
        lines.append(line)
    lines.append(f"{report['done']} of {len(report['stages'])} stages done.")
    return "\n".join(lines)
