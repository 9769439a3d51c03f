"""GLUE's tasks as a fine-tune suite reads them: each task's files in GLUE's published
layout (the directory its download script makes), the columns google-research/bert's
run_classifier.py (and Hugging Face's GLUE processors, its port) read, its labels in their
order, its kind and the metrics the GLUE leaderboard scores it by.

The columns are read by name from each file's header; ``published`` records where GLUE's
files have them, and the compiler checks that a local file has them there (a file in another
layout is one error at plan time). CoLA's files have no header: its columns are named here.
Files are split on tabs only, with no quoting (GLUE's readers use quotechar=None: MRPC's
texts hold unbalanced double quotes).

WNLI is left out, as the BERT paper leaves it out (its dev set is adversarial to a model
trained on its train set); the GLUE average is over the other tasks (runtime/glue_score.py).

Standard library only.

Usage:
    GLUE_TASKS["mnli"].dev_files      # {"matched": "dev_matched.tsv", "mismatched": ...}
    GLUE_TASKS["cola"].settings()     # the classification_task settings of the task
"""

from __future__ import annotations

import dataclasses
from typing import Optional

DEV = {"dev": "dev.tsv"}


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """Attributes:
      name: the task's name in finetune.suite (and its stage: finetune.<name>).
      directory: its directory in GLUE_DIR, as GLUE's download script names it.
      dev_files: dev set name -> file name in that directory (train is train.tsv).
      published: column index -> name in GLUE's files, for the columns read: the indices
        google-research/bert's processors read (-1: the last column).
      text_fields: the text columns, in order.
      label_field: the label column (a regression's: the score).
      labels: the labels in google-research/bert's order (None: a regression).
      kind: compiler/specs/task_kinds.py's kind.
      metrics: the leaderboard's metrics of the task.
      columns: the names of all columns of a file without a header (CoLA), else None.
    """

    name: str
    directory: str
    dev_files: dict
    published: dict
    text_fields: tuple[str, ...]
    label_field: str
    labels: Optional[tuple[str, ...]]
    kind: str
    metrics: tuple[str, ...]
    columns: Optional[tuple[str, ...]] = None

    @property
    def files(self) -> dict:
        """Split name ("train" or a dev set) -> file name."""
        return {"train": "train.tsv", **self.dev_files}

    def settings(self) -> dict:
        """The classification_task settings (ClassificationSpec fields) of the task."""
        return {"text_fields": list(self.text_fields), "label_field": self.label_field,
                "labels": list(self.labels) if self.labels else None, "kind": self.kind,
                "metrics": list(self.metrics), "columns": list(self.columns) if self.columns
                else None}


GLUE_TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("mnli", "MNLI", {"matched": "dev_matched.tsv", "mismatched": "dev_mismatched.tsv"},
             {8: "sentence1", 9: "sentence2", -1: "gold_label"}, ("sentence1", "sentence2"),
             "gold_label", ("contradiction", "entailment", "neutral"), "sentence_pair",
             ("accuracy",)),
    GlueTask("qqp", "QQP", DEV, {3: "question1", 4: "question2", 5: "is_duplicate"},
             ("question1", "question2"), "is_duplicate", ("0", "1"), "sentence_pair",
             ("f1", "accuracy")),
    GlueTask("qnli", "QNLI", DEV, {1: "question", 2: "sentence", -1: "label"},
             ("question", "sentence"), "label", ("entailment", "not_entailment"),
             "sentence_pair", ("accuracy",)),
    GlueTask("rte", "RTE", DEV, {1: "sentence1", 2: "sentence2", -1: "label"},
             ("sentence1", "sentence2"), "label", ("entailment", "not_entailment"),
             "sentence_pair", ("accuracy",)),
    GlueTask("mrpc", "MRPC", DEV, {0: "Quality", 3: "#1 String", 4: "#2 String"},
             ("#1 String", "#2 String"), "Quality", ("0", "1"), "sentence_pair",
             ("f1", "accuracy")),
    GlueTask("sst2", "SST-2", DEV, {0: "sentence", 1: "label"}, ("sentence",), "label",
             ("0", "1"), "single_sentence", ("accuracy",)),
    GlueTask("cola", "CoLA", DEV, {1: "label", 3: "sentence"}, ("sentence",), "label",
             ("0", "1"), "single_sentence", ("mcc",),
             columns=("source", "label", "original_label", "sentence")),
    GlueTask("stsb", "STS-B", DEV, {7: "sentence1", 8: "sentence2", -1: "score"},
             ("sentence1", "sentence2"), "score", None, "regression", ("pearson", "spearman")),
)}

LEFT_OUT = {"wnli": "WNLI is left out, as the BERT paper leaves it out: its dev set is "
                    "adversarial to a model trained on its train set"}


def header_problem(task: GlueTask, header: list[str]) -> Optional[str]:
    """What is wrong with a file's header (its first line's columns) for ``task``, or None:
    every column read must be where GLUE's files have it."""
    wrong = []
    for index, name in task.published.items():
        found = header[index] if -len(header) <= index < len(header) else None
        if found != name:
            where = "the last column" if index == -1 else f"column {index + 1}"
            wrong.append(f"{where} is {found!r}, GLUE's {task.directory} has {name!r}")
    return "; ".join(wrong) or None
