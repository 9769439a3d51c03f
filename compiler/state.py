"""What each stage will do, decided from small files in its output directory.

A finished stage directory holds MANIFEST.json (with the fingerprint it was built with) and
COMPLETED. A training stage that started holds STARTED.json (fingerprint and resume key)
and checkpoints. Reading these is cheap, so the dry run can say, for every stage:

  create   nothing usable there yet
  reuse    finished with the same fingerprint: skipped
  rebuild  finished with another fingerprint: built again (the old output is kept aside)
  resume   training started (or finished) with the same resume key: continued from its
           latest checkpoint
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Optional

from runexp.compiler import uris
from runexp.compiler.plan import COMPLETED_FILE, MANIFEST_FILE, Plan, Stage

STARTED_FILE = "STARTED.json"
TRAINING_KINDS = ("pretrain", "finetune")

CREATE, REUSE, REBUILD, RESUME = "create", "reuse", "rebuild", "resume"


@dataclasses.dataclass(frozen=True)
class StageState:
    action: str
    reason: str
    changes: tuple = ()  # (param, old, new) for rebuilds


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _changes(old: dict, new: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changes(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((prefix + key, a, b))
    return out


def latest_checkpoint_step(stage_dir: str) -> Optional[int]:
    """Step of the latest checkpoint, from TensorFlow's small `checkpoint` state file."""
    try:
        with open(os.path.join(stage_dir, "checkpoints", "checkpoint"), encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        return None
    match = re.search(r'model_checkpoint_path:\s*"[^"]*?(\d+)"', first)
    return int(match.group(1)) if match else None


def stage_state(stage: Stage, upstream: dict[str, StageState]) -> StageState:
    """Classifies one stage; `upstream` holds the states of the stages before it."""
    if uris.is_gcs(stage.output_dir):
        return StageState(CREATE, "gs:// outputs are checked when the run starts")
    d = stage.output_dir
    manifest = _read_json(os.path.join(d, MANIFEST_FILE))
    completed = os.path.isfile(os.path.join(d, COMPLETED_FILE))
    started = _read_json(os.path.join(d, STARTED_FILE))
    changed_deps = [dep for dep in stage.deps
                    if upstream.get(dep) and upstream[dep].action != REUSE]
    if completed and manifest and manifest.get("fingerprint") == stage.fingerprint:
        return StageState(REUSE, "finished earlier with the same inputs and parameters")
    latest = latest_checkpoint_step(d) if stage.kind in TRAINING_KINDS else None
    if stage.resume_key and latest is not None:
        record = manifest if completed else started
        steps = stage.params.get("train_steps")
        if record and record.get("resume_key") == stage.resume_key and steps is not None \
                and steps < latest:
            return StageState(REBUILD, f"train_steps ({steps}) is below the step of the "
                                       f"existing checkpoints ({latest}): training starts over")
        if record and record.get("resume_key") == stage.resume_key:
            if completed:
                changes = _changes(manifest.get("params", {}), dict(stage.params))
                what = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changes) or "run length"
                return StageState(RESUME, f"continues the finished run ({what})", tuple(changes))
            return StageState(RESUME, "an earlier run stopped; continues from its latest "
                                      "checkpoint")
    if completed and manifest:
        changes = _changes(manifest.get("params", {}), dict(stage.params))
        if changes:
            reason = "parameters changed"
        elif changed_deps:
            reason = "upstream changed: " + ", ".join(changed_deps)
        else:
            reason = "inputs changed (file contents or format version)"
        return StageState(REBUILD, reason, tuple(changes))
    if os.path.isdir(d) and os.listdir(d):
        return StageState(CREATE, "an earlier attempt did not finish; its partial output is "
                                  "replaced")
    return StageState(CREATE, "not built yet")


def plan_states(plan: Plan) -> dict[str, StageState]:
    states: dict[str, StageState] = {}
    for stage in plan.stages:
        states[stage.id] = stage_state(stage, states)
    return states
