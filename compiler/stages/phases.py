"""Pretraining in phases (`train.phases`): which phases an experiment has and what each sets.

Each phase is a preprocess stage per task and a pretrain stage. The first phase keeps the
ids of a single-phase plan (``preprocess.<task>``, ``pretrain``); phase n > 1 adds
``.phase<n>`` (``preprocess.<task>.phase2``, ``pretrain.phase2``). Its preprocess stages make
their examples from the first phase's tokenised splits (that stage keeps them: param
``keep_split_index``), so the corpus is read and tokenised once; its pretrain stage starts
from the previous phase's final checkpoint (input ``previous_phase_dir``). Evaluation,
fine-tuning and export follow the last phase.

A phase's keys are the gin names of the settings declared with ``phase=True``
(compiler/specs/phases.py); a key a phase leaves out keeps the experiment's value.

Usage:
    phases = read_phases(ctx)          # [Phase(1, ...), Phase(2, ...)]; None after errors
    phases[1].apply(builder, "pretrain")
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from runexp.compiler.errors import Location, did_you_mean
from runexp.compiler.specs.phases import LATER_PHASES_ONLY, PHASE_SETTINGS


@dataclasses.dataclass(frozen=True)
class Phase:
    """One pretraining phase.

    Attributes:
      number: 1, 2, ... in training order.
      count: how many phases the experiment has (1: no train.phases).
      values: phase key (a setting's gin name) -> its checked value in this phase.
      where: where train.phases was written (``file:line``), for provenance.
      location: the same, for errors and warnings.
    """

    number: int = 1
    count: int = 1
    values: dict = dataclasses.field(default_factory=dict)
    where: str = ""
    location: Optional[Location] = None

    @property
    def suffix(self) -> str:
        """What the phase adds to its stages' ids: nothing for the first."""
        return "" if self.number == 1 else f".phase{self.number}"

    @property
    def label(self) -> str:
        """A prefix for messages about values this phase may have set."""
        return f"phase {self.number}: " if self.count > 1 else ""

    @property
    def why(self) -> str:
        """The provenance of a value the phase sets."""
        return f"train.phases, phase {self.number} @ {self.where}"

    def sets(self, key: str) -> bool:
        return key in self.values

    def apply(self, b, kind: str) -> None:
        """Sets the values of ``kind``'s settings (preprocess or pretrain) the phase gives."""
        for key, value in self.values.items():
            owner, s = PHASE_SETTINGS[key]
            if owner == kind:
                b.set(s.name, value, self.why)

    def loc(self, ctx, key: str, configurable: str, param: str,
            scope: str = "") -> Optional[Location]:
        """Where the value of phase key ``key`` was set: train.phases when this phase sets
        it, else the binding of ``configurable.param``."""
        return self.location if self.sets(key) else ctx.loc(configurable, param, scope)


SINGLE = Phase()


def read_phases(ctx) -> Optional[list[Phase]]:
    """The experiment's phases: ``[SINGLE]`` without train.phases (or with an empty list);
    None after reporting a problem with it."""
    raw = ctx.r.get("train", "phases")
    if not raw:
        return [SINGLE]
    prov = ctx.r.provenance("train", "phases")
    location, where = prov.location, prov.short()
    errors = len(ctx.c.errors)
    phases = []
    for number, entry in enumerate(raw, 1):
        values: dict[str, Any] = {}
        for key, value in entry.items():
            if key not in PHASE_SETTINGS:
                ctx.c.error(f"train.phases: phase {number} sets {key!r}, which is not a "
                            "setting a phase can change", location,
                            hint=(did_you_mean(str(key), PHASE_SETTINGS) or "") +
                            f" (a phase sets {', '.join(sorted(PHASE_SETTINGS))}; the "
                            "others are the experiment's, for every phase)")
                continue
            _, s = PHASE_SETTINGS[key]
            checked = ctx.r.check_value(value, s.param, f"{key} of phase {number} "
                                        "(train.phases)", location)
            if checked is not None:
                values[key] = checked
        if number == 1:
            for key in LATER_PHASES_ONLY:
                if key in values:
                    ctx.c.warn(f"train.phases: phase 1 sets {key!r}, which applies to the "
                               "phases after the first (how each starts from the one before); "
                               "it is ignored", location, hint="remove it from phase 1")
                    del values[key]
        phases.append(values)
    if len(ctx.c.errors) > errors:
        return None
    return [Phase(n, len(phases), values, where, location)
            for n, values in enumerate(phases, 1)]
