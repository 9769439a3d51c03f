"""The suite stage's settings (which fine-tunes it summarises, and which of them GLUE's
leaderboard rule averages) and its summary."""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import Spec, setting
from runexp.compiler.specs.outputs import Summary, output


@dataclasses.dataclass(frozen=True)
class SuiteSpec(Spec):
    """Derived from `finetune.suite`: nothing of it is set in gin directly."""

    tasks: tuple[str, ...] = setting((), "the suite's tasks in order (finetune.suite)", gin=None,
                                     shown=True)
    glue_tasks: tuple[str, ...] = setting((), "those that are GLUE's, averaged by GLUE's rule "
                                              "(runtime/glue_score.py)", gin=None)


@dataclasses.dataclass(frozen=True)
class SuiteSummary(Summary):
    """The suite stage's summary (suite.json holds the details)."""

    task_scores: Optional[dict] = output("each task's score: its metrics' mean over its dev "
                                         "sets")
    glue_average: Optional[float] = output("the GLUE average over glue_tasks", optional=True)
    glue_tasks: Optional[list] = output("the GLUE tasks averaged (WNLI left out)",
                                        optional=True)


@dataclasses.dataclass(frozen=True)
class SuiteTask(Summary):
    """One task in suite.json."""

    kind: Optional[str] = output("the task's kind (compiler/specs/task_kinds.py)")
    metrics: Optional[list] = output("the metrics it is scored by")
    dev_sets: Optional[dict] = output("each dev set's scores of those metrics")
    score: Optional[float] = output("the task score: their mean over the dev sets")
    dev_examples: Optional[int] = output("dev examples over every dev set")
