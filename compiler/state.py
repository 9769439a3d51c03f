"""What each stage will do, decided from small files in its output directory.

A finished stage directory holds MANIFEST.json (with the fingerprint it was built with) and
COMPLETED. A training stage that started holds STARTED.json (fingerprint and resume key)
and checkpoints. Reading these is cheap, so the dry run can say, for every stage:

  create   nothing usable there yet
  reuse    finished with the same fingerprint: skipped
  rebuild  finished with another fingerprint: built again (the old output is kept aside)
  resume   training started (or finished) with the same resume key: continued from its
           latest checkpoint

gs:// inputs are fingerprinted by a listing made at compile time (compiler/gcs_inputs.py);
the executor keeps that listing in MANIFEST.json, so a rebuild's reason names each object
that changed: "input changed: gs://b/corpus/part-1.txt (generation 2 -> 3, ...)", "input
added: ...", "input removed: ...". A gs:// input that could not be listed (offline, no
credentials, RUNEXP_NO_INPUT_LISTING=1) keeps the constant fingerprint of earlier versions:
a stage built from a listing is then rebuilt, saying that whether the input changed cannot
be told; a stage built unlisted too is reused, but its reason (and every downstream stage's)
says that a change to that input would go unnoticed. "reuse" is never said silently for
data that could not be checked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Optional

from runexp.compiler import uris
from runexp.compiler.kinds import TRAINING_KINDS
from runexp.compiler.plan import COMPLETED_FILE, MANIFEST_FILE, Plan, Stage
from runexp.compiler.specs.source import SourceSpec
from runexp.runtime import storage

STARTED_FILE = "STARTED.json"

CREATE, REUSE, REBUILD, RESUME = "create", "reuse", "rebuild", "resume"
SKIP = "skip"  # left out of this run by --until/--only (compiler/selection.py)


@dataclasses.dataclass(frozen=True)
class StageState:
    action: str
    reason: str
    changes: tuple = ()  # (param, old, new) for rebuilds
    # (gs:// input, why) of the inputs this stage or one upstream could not list
    unverified: tuple = ()


# Objects named one by one in a rebuild's reason; the rest are counted.
MAX_NAMED_OBJECTS = 3


class _Files:
    """The few reads the state needs, on local disk or on gs:// (through the storage layer,
    imported only for gs://: it has no TensorFlow; google-cloud-storage loads on first use)."""

    def __init__(self, gcs: bool):
        self.storage = None
        if gcs:
            self.storage = storage

    def text(self, path: str) -> Optional[str]:
        try:
            if self.storage is not None:
                return self.storage.read_text(path)
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (OSError, ValueError):
            return None

    def json(self, path: str) -> Optional[dict]:
        text = self.text(path)
        try:
            return json.loads(text) if text is not None else None
        except ValueError:
            return None

    def exists(self, path: str) -> bool:
        return self.storage.exists(path) if self.storage is not None else os.path.exists(path)

    def nonempty_dir(self, path: str) -> bool:
        if self.storage is not None:
            return bool(self.storage.list(path))
        return os.path.isdir(path) and bool(os.listdir(path))


def _changes(old: dict, new: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changes(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((prefix + key, a, b))
    return out


def _formats(inputs: dict) -> dict:
    """{task: (format, text_field)} of a vocab stage's ``sources`` input (compiler/stages/
    vocab.py); {} when it has none (every task sentence_lines)."""
    sources = inputs.get("sources")
    if not isinstance(sources, dict):
        return {}
    return {t: (v.get("format"), v.get("text_field")) for t, v in sources.items()
            if isinstance(v, dict)}


def _format_changes(old: dict, new: dict) -> list[str]:
    a, b = _formats(old), _formats(new)
    out = []
    for task in sorted(set(a) | set(b)):
        fa, fb = a.get(task, (SourceSpec.format, None)), b.get(task, (SourceSpec.format, None))
        if fa != fb:
            out.append(f"task {task} is read as {fb[0]!r}, was {fa[0]!r}" if fa[0] != fb[0] else
                       f"task {task} reads text_field {fb[1]!r}, was {fa[1]!r}")
    return out


def _why(listing: str) -> str:
    return listing[len("not listed: "):] if listing.startswith("not listed: ") else listing


def _object_change(uri: str, old: dict, new: dict) -> str:
    parts = [f"{field} {old.get(field)} -> {new.get(field)}{unit}"
             for field, unit in (("generation", ""), ("size", " bytes"), ("crc32c", ""))
             if old.get(field) != new.get(field)]
    return f"input changed: {uri} ({', '.join(parts)})"


def input_changes(stage: Stage, manifest: Optional[dict]) -> list[str]:
    """How the gs:// inputs of ``stage`` differ from the ones it was built from (the listing
    in its MANIFEST.json), object by object; and which of them cannot be compared."""
    before = (manifest or {}).get("input_objects") or {}
    objects, notes = [], []
    for key in sorted(stage.input_objects or {}):
        now, then = stage.input_objects[key], before.get(key)
        if isinstance(now, str):
            notes.append(f"{key} could not be listed ({_why(now)}): whether it changed "
                         "cannot be told")
        elif then is None:
            notes.append(f"{key} was not listed when the stage was built (by an earlier "
                         "runexp, or from other inputs): its objects cannot be compared")
        elif isinstance(then, str):
            notes.append(f"{key} could not be listed when the stage was built "
                         f"({_why(then)}): its objects cannot be compared")
        else:
            for uri in sorted(set(now) | set(then)):
                old, new = then.get(uri), now.get(uri)
                if old == new:
                    continue
                objects.append(f"input added: {uri}" if old is None else
                               f"input removed: {uri}" if new is None else
                               _object_change(uri, old, new))
    if len(objects) > MAX_NAMED_OBJECTS:
        more = len(objects) - MAX_NAMED_OBJECTS
        objects = objects[:MAX_NAMED_OBJECTS] + [f"and {more} more changed object"
                                                 + ("s" if more > 1 else "")]
    return objects + notes


def _unverified(stage: Stage, upstream: dict[str, StageState]) -> tuple:
    own = [(k, _why(v)) for k, v in sorted((stage.input_objects or {}).items())
           if isinstance(v, str)]
    for dep in stage.deps:
        if upstream.get(dep):
            own += [u for u in upstream[dep].unverified if u not in own]
    return tuple(own)


def latest_checkpoint_step(stage_dir: str, files: Optional[_Files] = None) -> Optional[int]:
    """Step of the latest checkpoint, from TensorFlow's small `checkpoint` state file."""
    files = files or _Files(uris.is_gcs(stage_dir))
    text = files.text(uris.join(stage_dir, "checkpoints", "checkpoint"))
    match = re.search(r'model_checkpoint_path:\s*"[^"]*?(\d+)"', text or "")
    return int(match.group(1)) if match else None


def stage_state(stage: Stage, upstream: dict[str, StageState]) -> StageState:
    """Classifies one stage; `upstream` holds the states of the stages before it."""
    unverified = _unverified(stage, upstream)
    state = _stage_state(stage, upstream)
    if state.action == REUSE and unverified:
        shown = "; ".join(f"{k} ({why})" for k, why in unverified[:MAX_NAMED_OBJECTS])
        more = len(unverified) - MAX_NAMED_OBJECTS
        state = dataclasses.replace(state, reason=(
            "finished earlier with the same parameters, and inputs that look the same, but "
            f"NOT verified: gs:// input(s) could not be listed, so a change to them would go "
            f"unnoticed: {shown}" + (f" and {more} more" if more > 0 else "")))
    return dataclasses.replace(state, unverified=unverified)


def _stage_state(stage: Stage, upstream: dict[str, StageState]) -> StageState:
    d = stage.output_dir
    files = _Files(uris.is_gcs(d))
    manifest = files.json(uris.join(d, MANIFEST_FILE))
    completed = files.exists(uris.join(d, COMPLETED_FILE))
    started = files.json(uris.join(d, STARTED_FILE))
    changed_deps = [dep for dep in stage.deps
                    if upstream.get(dep) and upstream[dep].action != REUSE]
    if completed and manifest and manifest.get("fingerprint") == stage.fingerprint:
        return StageState(REUSE, "finished earlier with the same inputs and parameters")
    latest = latest_checkpoint_step(d, files) if stage.kind in TRAINING_KINDS else None
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
        parts = ["parameters changed"] if changes else []
        parts += input_changes(stage, manifest)
        if not parts:  # the same files, read otherwise: a task's format (vocab inputs)
            parts += _format_changes(manifest.get("inputs") or {}, dict(stage.inputs))
        if changed_deps:
            parts.append("upstream changed: " + ", ".join(changed_deps))
        reason = "; ".join(parts) or "inputs changed (file contents or format version)"
        return StageState(REBUILD, reason, tuple(changes))
    if files.nonempty_dir(d):
        return StageState(CREATE, "an earlier attempt did not finish; its partial output is "
                                  "replaced")
    return StageState(CREATE, "not built yet")


def plan_states(plan: Plan, offline: bool = False) -> dict[str, StageState]:
    """Every stage's action. A gs:// root that cannot be read (no credentials, no network)
    makes every stage "create" with the reason, rather than failing the dry run; with
    ``offline`` (--offline) a gs:// root is not read at all, and the reason says so."""
    states: dict[str, StageState] = {}
    for stage in plan.stages:
        if offline and uris.is_gcs(stage.output_dir):
            states[stage.id] = StageState(CREATE, "not known: planned --offline (its state on "
                                                  "gs:// was not read)")
            continue
        try:
            states[stage.id] = stage_state(stage, states)
        except Exception as e:  # storage errors, missing credentials, no network
            if not uris.is_gcs(stage.output_dir):
                raise
            first = str(e).split(". ")[0][:120]
            reason = f"could not read the state on gs:// ({type(e).__name__}: {first})"
            return {s.id: states.get(s.id) or StageState(CREATE, reason) for s in plan.stages}
    return states
