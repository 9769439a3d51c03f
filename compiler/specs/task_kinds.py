"""What a fine-tune task is: its kind (single sentence, sentence pair, regression), and the
metrics it is scored by, declared once here.

The metric names are those the finetune stage writes into metrics.json and the suite
summary averages; their computations are runtime/task_metrics.py's (checked against
scikit-learn and SciPy in tests). A task's metric set is its kind's unless the task names
its own (``classification_task.metrics``, or a GLUE task's in compiler/glue_tasks.py).

Standard library only (the compiler, the runtime and tasks/ read it).

Usage:
    kind = task_kind(None, ["sentence1", "sentence2"])   # KINDS["sentence_pair"]
    kind.metrics                                          # ("accuracy",)
    KINDS["regression"].regression                        # True: 1-output head, MSE loss
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

# The metric of every classification, and of runs older than task kinds.
ACCURACY = "accuracy"
# Metric name -> what it is. Classification metrics compare label ids; regression metrics
# compare float scores.
CLASSIFICATION_METRICS = {
    ACCURACY: "fraction of examples whose predicted label is the gold one",
    "f1": "F1 of the positive class (the second label, as GLUE's MRPC and QQP '1')",
    "mcc": "Matthews correlation coefficient (GLUE's CoLA)",
}
REGRESSION_METRICS = {
    "pearson": "Pearson correlation of predicted and gold scores (GLUE's STS-B)",
    "spearman": "Spearman rank correlation of predicted and gold scores (GLUE's STS-B)",
}
METRICS = {**CLASSIFICATION_METRICS, **REGRESSION_METRICS}


@dataclasses.dataclass(frozen=True)
class TaskKind:
    """Attributes:
      name: the kind, as ``classification_task.kind`` names it.
      text_fields: how many text fields an example has (None: one or two).
      regression: a 1-output head trained with mean squared error on float labels;
        otherwise a softmax over the labels trained with cross-entropy.
      metrics: the metrics a task of this kind is scored by unless it names its own.
    """

    name: str
    text_fields: Optional[int]
    regression: bool
    metrics: tuple[str, ...]

    @property
    def allowed_metrics(self) -> dict[str, str]:
        """The metrics that make sense for this kind (name -> what it is)."""
        return REGRESSION_METRICS if self.regression else CLASSIFICATION_METRICS


KINDS: dict[str, TaskKind] = {k.name: k for k in (
    TaskKind("single_sentence", 1, False, (ACCURACY,)),
    TaskKind("sentence_pair", 2, False, (ACCURACY,)),
    TaskKind("regression", None, True, ("pearson", "spearman")),
)}


def task_kind(kind: Optional[str], text_fields: Sequence[str]) -> TaskKind:
    """The kind a task declares, or (None) the classification kind its text fields imply."""
    if kind is not None:
        return KINDS[kind]
    return KINDS["sentence_pair" if len(text_fields) == 2 else "single_sentence"]


def metric_names(kind: TaskKind, declared: Optional[Sequence[str]]) -> tuple[str, ...]:
    """The metrics a task is scored by: the ones it declares, else its kind's."""
    return tuple(declared) if declared else kind.metrics
