"""The sweep stage's settings: a grid over fine-tune settings, and how its point is chosen.

`finetune.sweep` names settings of `finetune` and the values each takes; every combination
is one finetune stage (compiler/sweep.py), and the sweep stage of the task scores them
together (runtime/stages/sweep.py). A swept `seed` repeats each other combination: the
selection is over the mean of the seeds.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import Spec, setting
from runexp.compiler.specs.finetune import FinetuneMetrics
from runexp.compiler.specs.outputs import Summary, output

# How a point's settings are chosen, recorded in the plan (and so in the fingerprint).
RULE = ("the setting with the highest mean dev score over its seeds (ties: the first in the "
        "grid); of its seeds, the one with the highest dev score is the exported point")


@dataclasses.dataclass(frozen=True)
class SweepSpec(Spec):
    """`finetune.sweep`, `finetune.select_metric`, `finetune.export_point`; the rest derived."""

    grid: Optional[dict] = setting(None, "settings of finetune and the values each takes, "
                                         "e.g. {'learning_rate': [5e-5, 3e-5, 2e-5], "
                                         "'batch_size': [16, 32], 'seed': [1, 2]}: one "
                                         "finetune stage per combination; None: no sweep",
                                   gin="sweep", shown=True)
    select_metric: Optional[str] = setting(None, "the dev metric the point is chosen by (its "
                                                 "mean over the task's dev sets); None: the "
                                                 "task score (its metrics' mean, GLUE's rule)",
                                           shown=True)
    export_point: Optional[str] = setting(None, "the point the export takes, by its stage "
                                                "id's suffix (e.g. 'lr3e-5.s2'); None: the "
                                                "selected one", shown=True)
    task: str = setting("", "the fine-tuned task", gin=None, shown=True)
    points: dict = setting(None, "point name -> the settings it sets (stage param -> value)",
                           gin=None)
    varied: tuple[str, ...] = setting((), "the swept stage params besides the seed, in the "
                                          "points' order", gin=None)
    rule: str = setting(RULE, "how the selected point is chosen", gin=None)


@dataclasses.dataclass(frozen=True)
class SweepSummary(Summary):
    """The sweep stage's summary (sweep.json holds the grid)."""

    selected: Optional[str] = output("the selected setting (a point without its seed)")
    mean: Optional[float] = output("its dev score, the mean over its seeds")
    std: Optional[float] = output("their sample standard deviation (None for one seed)")
    exported: Optional[str] = output("the point the export takes")
    points: Optional[int] = output("points in the grid")
    metric: Optional[str] = output("what the dev score is: select_metric, or the task score")


@dataclasses.dataclass(frozen=True)
class SweepMetrics(FinetuneMetrics):
    """A sweep stage's metrics.json: the selected setting's dev-set scores, each the mean
    over its seeds, in the finetune stage's layout (a suite scores a swept task by it, the
    export reads its labels)."""

    std: Optional[dict] = output("each dev set's metrics' sample standard deviation over the "
                                 "seeds (None for one seed)")
    point: Optional[str] = output("the selected setting")
    points: Optional[list] = output("its points (one per seed)")
    seeds: Optional[int] = output("how many")
    exported: Optional[str] = output("the point the export takes")
