"""The suite stage's settings: which fine-tunes it summarises, and which of them GLUE's
leaderboard rule averages."""

from __future__ import annotations

import dataclasses

from runexp.compiler.specs.base import Spec, setting


@dataclasses.dataclass(frozen=True)
class SuiteSpec(Spec):
    """Derived from `finetune.suite`: nothing of it is set in gin directly."""

    tasks: tuple[str, ...] = setting((), "the suite's tasks in order (finetune.suite)", gin=None)
    glue_tasks: tuple[str, ...] = setting((), "those that are GLUE's, averaged by GLUE's rule "
                                              "(runtime/glue_score.py)", gin=None)
