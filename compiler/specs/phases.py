"""What a pretraining phase may set: the settings declared with ``phase=True``.

`train.phases` in gin is a list of dicts, one per phase, in order; a phase's keys are these
settings' gin names (``'steps'``, not ``train_steps``) and each takes its type, bounds and
doc from its one declaration. A key a phase leaves out keeps the experiment's value (the
single-phase setting). Standard library only.

Usage:
    PHASE_SETTINGS["steps"]          # ("pretrain", Setting(name="train_steps", ...))
    PHASE_SETTINGS["max_seq_length"] # ("preprocess", Setting(...))
"""

from __future__ import annotations

from runexp.compiler.specs.base import Setting
from runexp.compiler.specs.preprocess import PreprocessSpec
from runexp.compiler.specs.train import TrainSpec

# The kinds whose settings a phase may change: a phase is a preprocess stage per task and a
# pretrain stage.
_PHASE_KINDS = (("preprocess", PreprocessSpec), ("pretrain", TrainSpec))

# Settings that only mean something after the first phase (how a phase starts from the one
# before): the first phase's stage leaves them out.
LATER_PHASES_ONLY = ("optimizer_state",)


def _phase_settings() -> dict[str, tuple[str, Setting]]:
    out: dict[str, tuple[str, Setting]] = {}
    for kind, spec in _PHASE_KINDS:
        for s in spec.settings():
            if s.phase:
                if s.gin in out:
                    raise AssertionError(f"phase key {s.gin!r} declared twice")
                out[s.gin] = (kind, s)
    return out


PHASE_SETTINGS: dict[str, tuple[str, Setting]] = _phase_settings()
