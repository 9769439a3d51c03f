"""What differs between two plans: their values, and which stages one would rebuild.

Structural, not line-based: values are compared by stage and parameter (a nested dict such
as ``model`` by its keys), so a line inserted in a gin file changes no entry, only the line
numbers of the provenance, which is shown, not compared. Settings of the experiment that no
stage holds (``experiment.max_attempts``, the TPU's name...) are compared through the
plans' operative configs.

Which stages NEW would rebuild where OLD ran is decided from the stages' fingerprints, as
the executor decides it (compiler/state.py): a stage is rebuilt for its own changed values
or inputs, or only because an upstream stage changed; a training stage whose resume key is
unchanged continues from OLD's checkpoints. A gs:// input that one side could not list
(``--offline``) gives its stage a provisional fingerprint; such a stage is judged by its
values and its upstream stages instead, and says so.

Usage:
    d = diff_plans(old_plan, new_plan)
    d.values        # ValueChange per differing value, in plan order
    d.stages        # StageChange per stage: create / rebuild / resume / reuse / drop
    d.same          # nothing differs
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Collection, Optional

from runexp.compiler.plan import Plan, Stage
from runexp.compiler.state import CREATE, REBUILD, RESUME, REUSE

DROP = "drop"  # a stage of OLD that NEW does not have
ABSENT = object()  # the side of a ValueChange where the value does not exist
INPUT = "<-"  # marks an input in a ValueChange's key, as the plan renders inputs

# experiment.* settings that are not compared: where and under which name an experiment
# runs is not what it computes; the accelerator profile is compared in the stages' params.
_NOT_COMPARED = frozenset({"experiment.name", "experiment.output_root",
                           "experiment.accelerator"})


@dataclasses.dataclass(frozen=True)
class ValueChange:
    """One value that differs. ``old`` or ``new`` is ABSENT for an added or removed one;
    ``old_where`` and ``new_where`` are its provenance on each side (file:line, "default")."""

    stage: str  # a stage id, or "" for a setting of the experiment
    name: str  # "learning_rate", "model.hidden_size", "<- train_files", "experiment.x"
    old: Any
    new: Any
    old_where: str = ""
    new_where: str = ""

    @property
    def key(self) -> str:
        if not self.stage:
            return self.name
        return f"{self.stage} {self.name}" if self.name.startswith(INPUT) else \
            f"{self.stage}.{self.name}"

    @property
    def symbol(self) -> str:
        return "+" if self.old is ABSENT else "-" if self.new is ABSENT else "~"


@dataclasses.dataclass(frozen=True)
class StageChange:
    """What NEW would do with one stage where OLD ran, and why."""

    id: str
    kind: str
    action: str  # CREATE, REBUILD, RESUME, REUSE or DROP
    reason: str
    own: tuple[str, ...] = ()  # its own values that changed
    upstream: tuple[str, ...] = ()  # the stages it reads that changed
    differs: bool = True  # False: the same stage on both sides (whether or not OLD built it)
    only_in: str = ""  # "OLD" or "NEW" for a stage one side does not have


@dataclasses.dataclass(frozen=True)
class PlanDiff:
    values: tuple[ValueChange, ...]
    equal: int  # values equal on both sides (not shown)
    stages: tuple[StageChange, ...]

    @property
    def same(self) -> bool:
        return not self.values and not any(s.differs for s in self.stages)

    def actions(self, action: str) -> list[StageChange]:
        return [s for s in self.stages if s.action == action]


def _plain(value: Any) -> Any:
    """The value as a plan.json holds it (tuples as lists), so a compiled plan and a saved
    one compare equal."""
    return json.loads(json.dumps(value, default=str))


def _rebased(value: Any, root: str) -> Any:
    """Paths under the output root as <root>/...: two roots' stages read the same inputs."""
    if isinstance(value, str):
        root = root.rstrip("/")
        return "<root>" + value[len(root):] if value == root or value.startswith(root + "/") \
            else value
    if isinstance(value, list):
        return [_rebased(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _rebased(v, root) for k, v in value.items()}
    return value


def _leaves(value: Any, name: str) -> dict[str, Any]:
    """A dict param by its keys (``model.hidden_size``); any other value whole."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{name}.{k}"))
        return out
    return {name: value}


def _stage_values(stage: Stage, root: str) -> dict[str, tuple[Any, str]]:
    """{name: (value, provenance)} of a stage's params and inputs."""
    out: dict[str, tuple[Any, str]] = {}
    for param, value in _plain(dict(stage.params)).items():
        where = stage.provenance.get(param, "")
        out.update({k: (v, where) for k, v in _leaves(value, param).items()})
    for name, value in _plain(dict(stage.inputs)).items():
        out[f"{INPUT} {name}"] = (_rebased(value, root), "")
    return out


def _set(stage: Stage) -> list[tuple[str, Any, str]]:
    """(param, value, provenance) of the params a file or flag set (provenance ending in a
    line number), in name order: the defaults and derived values of a stage are left out."""
    return [(k, v, stage.provenance.get(k, "")) for k, v in sorted(_plain(dict(stage.params))
                                                                  .items())
            if re.search(r":\d+$", stage.provenance.get(k, ""))]


class _Written(str):
    """A value as the operative config writes it (gin syntax), shown as it is."""

    def __repr__(self) -> str:
        return str(self)


def _operative(plan: Plan) -> dict[str, tuple[str, str]]:
    """{experiment.setting: (value as written, provenance)} from the operative config's
    ``name = value  # where`` lines (planner.operative_config)."""
    out = {}
    for line in plan.operative_config.splitlines():
        if not line.startswith("experiment."):
            continue
        binding, _, where = line.rpartition("  # ")
        name, _, value = binding.partition(" = ")
        if name not in _NOT_COMPARED:
            out[name] = (_Written(value), where)
    return out


def _compare(stage: str, old: dict, new: dict) -> tuple[list[ValueChange], int]:
    changes, equal = [], 0
    for name in sorted(set(old) | set(new)):
        a, wa = old.get(name, (ABSENT, ""))
        b, wb = new.get(name, (ABSENT, ""))
        if a == b and a is not ABSENT:
            equal += 1
        else:
            changes.append(ValueChange(stage, name, a, b, wa, wb))
    return changes, equal


def _provisional(old: Stage, new: Stage) -> bool:
    """One side could not list a gs:// input its fingerprint rests on, so the fingerprints
    cannot be compared (compiler/gcs_inputs.py NOT_LISTED)."""
    listings = [*(old.input_objects or {}).values(), *(new.input_objects or {}).values()]
    return any(isinstance(v, str) for v in listings) and \
        dict(old.input_objects or {}) != dict(new.input_objects or {})


def _names(changes: list[ValueChange]) -> tuple[str, ...]:
    return tuple(c.name for c in changes)


def _stage_change(old: Optional[Stage], new: Stage, own: list[ValueChange],
                  upstream: list[str], finished: Optional[Collection[str]]) -> StageChange:
    """The action of one stage of NEW where OLD ran (``finished``: the stages done in OLD's
    root; None when OLD is not a run but a plan)."""
    if old is None:
        return StageChange(new.id, new.kind, CREATE, "new: OLD has no such stage",
                           only_in="NEW")
    names = _names(own)
    provisional = _provisional(old, new)
    changed = bool(names or upstream) if provisional else old.fingerprint != new.fingerprint
    caveat = " (provisional: a gs:// input was not listed, so a change to its objects " \
             "goes unseen)" if provisional else ""
    if not changed:
        if finished is not None and new.id not in finished:
            return StageChange(new.id, new.kind, CREATE,
                               "the same as OLD's, but OLD never finished it" + caveat,
                               differs=False)
        reason = "the same as OLD's" + caveat
        if names:  # values that change how a stage is made, never what (KINDS.operational)
            reason = (f"changed only in how it is made ({', '.join(names)}), not in what it "
                      "is" + caveat)
        return StageChange(new.id, new.kind, REUSE, reason, names, differs=False)
    why = []
    if names:
        why.append(f"its own values changed ({', '.join(names)})")
    if upstream:
        why.append(("upstream changed too: " if names else "only because upstream changed: ")
                   + ", ".join(upstream))
    if not why:
        why.append("its inputs' contents changed (input files, gs:// objects, or the "
                   "format version of this kind of stage)")
    reason = "; ".join(why) + caveat
    if finished is not None and new.id not in finished:
        return StageChange(new.id, new.kind, CREATE, f"OLD never finished it, and {reason}",
                           names, tuple(upstream))
    resumable = old.resume_key and old.resume_key == new.resume_key
    old_steps, new_steps = old.params.get("train_steps"), new.params.get("train_steps")
    if resumable and isinstance(old_steps, int) and isinstance(new_steps, int) \
            and new_steps >= old_steps:
        return StageChange(new.id, new.kind, RESUME,
                           f"continues from OLD's checkpoints: {reason}", names, tuple(upstream))
    return StageChange(new.id, new.kind, REBUILD, reason, names, tuple(upstream))


def diff_plans(old: Plan, new: Plan, finished: Optional[Collection[str]] = None) -> PlanDiff:
    """Compares two plans. ``finished``: the ids of the stages finished in OLD's output
    root, when OLD is a run (a stage it never finished is created, not reused)."""
    values: list[ValueChange] = []
    equal = 0
    changes, n = _compare("", _operative(old), _operative(new))
    values += changes
    equal += n
    old_stages = {s.id: s for s in old.stages}
    stages: list[StageChange] = []
    changed: set[str] = set()
    for stage in new.stages:  # in plan order: upstream stages are decided first
        before = old_stages.get(stage.id)
        own: list[ValueChange] = []
        if before is not None:
            own, n = _compare(stage.id, _stage_values(before, old.output_root),
                              _stage_values(stage, new.output_root))
            equal += n
        values += own
        upstream = [d for d in stage.deps if d in changed]
        change = _stage_change(before, stage, own, upstream, finished)
        if change.differs:
            changed.add(stage.id)
        stages.append(change)
    new_ids = {s.id for s in new.stages}
    for stage in old.stages:
        if stage.id not in new_ids:
            stages.append(StageChange(stage.id, stage.kind, DROP, "NEW has no such stage "
                                      "(OLD's output is left as it is)", only_in="OLD"))
    # A stage on one side only: the params a file or flag set, whole, as added or removed.
    for stage in new.stages:
        if stage.id not in old_stages:
            values += [ValueChange(stage.id, k, ABSENT, v, "", w) for k, v, w in _set(stage)]
    for stage in old.stages:
        if stage.id not in new_ids:
            values += [ValueChange(stage.id, k, v, ABSENT, w, "") for k, v, w in _set(stage)]
    return PlanDiff(tuple(values), equal, tuple(stages))
