"""The finetune stage's settings (a classification task and how it is trained) and its
summary: each dev set's scores."""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import Spec, nested, setting
from runexp.compiler.specs.outputs import Summary, output
from runexp.compiler.specs.task_kinds import (ACCURACY, KINDS, METRICS, TaskKind, metric_names,
                                              task_kind)
from runexp.compiler.specs.train import OptimizerSpec, TrainSpec


@dataclasses.dataclass(frozen=True)
class ClassificationSpec(Spec):
    """`classification_task` in gin (scoped by the task's name), besides its files: a
    classification of one sentence or a pair, or a regression (compiler/specs/task_kinds.py)."""

    text_fields: tuple[str, ...] = setting(("sentence",), "one field, or two for pairs")
    label_field: str = setting("label", "the label column")
    labels: Optional[tuple[str, ...]] = setting(None, "labels; None reads them from train")
    # Left out of a plan while unset (compiler/stages/finetune.py), so the plans of
    # experiments that predate them keep their fingerprints.
    kind: Optional[str] = setting(None, "single_sentence, sentence_pair or regression (a "
                                        "1-output head, MSE loss, float labels); None: a "
                                        "classification by the number of text_fields",
                                  choices=tuple(KINDS))
    metrics: Optional[tuple[str, ...]] = setting(None, "metrics scored on each dev set "
                                                       "(compiler/specs/task_kinds.py); None: "
                                                       "the kind's")
    columns: Optional[tuple[str, ...]] = setting(None, "the column names of a TSV without a "
                                                       "header line (GLUE's CoLA); None: its "
                                                       "first line names them")

    def task_kind(self) -> TaskKind:
        """The declared kind, or the classification kind of the text fields."""
        return task_kind(self.kind, self.text_fields)

    def scored_by(self) -> tuple[str, ...]:
        """The metrics each dev set is scored by."""
        return metric_names(self.task_kind(), self.metrics)


@dataclasses.dataclass(frozen=True)
class FinetuneSpec(Spec):
    """`finetune` in gin: a classifier on the pretrained (or a released) encoder. The
    optimizer is BERT's run_classifier one: AdamW, linear decay, clipping at 1.0."""

    task: str = setting("", "the classification_task's name (finetune.task)", gin=None, shown=True)
    data: ClassificationSpec = nested(ClassificationSpec, "the task's fields and labels",
                                      configurable="classification_task")
    init_checkpoint: Optional[str] = setting(None, "checkpoint in Google's BERT layout to "
                                                   "fine-tune (None: the pretrain stage's)",
                                             shown=True)
    model: dict = setting(None, "the encoder's bert_config", gin=None)
    batch_size: int = setting(32, "global batch size", minimum=1, shown=True)
    learning_rate: float = setting(2e-5, "peak learning rate", minimum=0.0, shown=True)
    warmup_steps: int = setting(100, "warmup steps", minimum=0, shown=True)
    weight_decay: float = setting(0.01, "AdamW weight decay", minimum=0.0)
    seed: int = setting(12345, "seed")
    train_steps: int = setting(1000, "training steps", gin="steps", minimum=1, shown=True)
    max_seq_length: int = setting(128, "tokens per example", minimum=8, shown=True)
    compute_dtype: str = setting(TrainSpec.compute_dtype, "the pretraining compute dtype "
                                                          "(train.compute_dtype)",
                                 gin="train.compute_dtype")
    recompute: str = setting(TrainSpec.recompute, "the pretraining's activation recomputation "
                                                  "(train.recompute): long sequences fit in "
                                                  "less memory", gin="train.recompute",
                             choices=("none", "layers"))
    accelerator: Optional[dict] = setting(None, "the accelerator profile", gin=None)
    deadline_unix: Optional[float] = setting(None, "stop with a checkpoint before this "
                                                   "time.time() (from experiment.wall_time_hours)",
                                             planned=False)
    deadline_margin_s: Optional[float] = setting(None, "seconds kept free before the deadline "
                                                       "(experiment.wall_time_margin_minutes)",
                                                 planned=False)

    def optimization(self) -> OptimizerSpec:
        """The optimizer: this spec's rate, warmup and decay; the rest OptimizerSpec's."""
        return OptimizerSpec(learning_rate=self.learning_rate, warmup_steps=self.warmup_steps,
                             weight_decay=self.weight_decay)


@dataclasses.dataclass(frozen=True)
class Scores(Summary):
    """A dev set's scores."""

    values: dict = output("each metric's score, by its name (compiler/specs/task_kinds.py)",
                          spread=dict, keys=tuple(METRICS), named="metric")
    majority_baseline: Optional[float] = output(
        "the baseline: accuracy of always predicting the train set's most frequent label (a "
        "classification's)", optional=True)


@dataclasses.dataclass(frozen=True)
class DevScores(Scores):
    """One dev set's scores, and how many examples they are of."""

    examples: Optional[int] = output("dev examples scored", optional=True)


@dataclasses.dataclass(frozen=True)
class FinetuneSummary(Summary):
    """The finetune stage's summary; its metrics.json holds the same and the labels.

    Runs older than task kinds and several dev sets wrote the accuracy (and
    ``majority_baseline``) alone: read, they are the scores of one dev set named "dev"."""

    scores: Scores = output("the first dev set's scores", spread=Scores)
    kind: Optional[str] = output("the task's kind (compiler/specs/task_kinds.py)")
    metrics: Optional[list] = output("the metrics each dev set is scored by")
    dev_sets: Optional[dict] = output("each dev set's scores", each=DevScores, named="dev set")
    num_labels: Optional[int] = output("the classifier's outputs (1: a regression)")
    dev_examples: Optional[int] = output("dev examples over every dev set")
    train_examples: Optional[int] = output("training examples")
    step: Optional[int] = output("the fine-tuned checkpoint's training step (not a sweep's "
                                 "mean)", optional=True)

    @property
    def scored_by(self) -> list:
        """The metrics each dev set is scored by (older runs: accuracy)."""
        return list(self.metrics or [ACCURACY])

    def dev_scores(self) -> dict:
        """Each dev set's scores (an older run's: its one set, "dev"); {} without any."""
        if self.dev_sets:
            return dict(self.dev_sets)
        if self.scored_by[0] not in self.scores.values:
            return {}
        return {"dev": DevScores.read(self.scores.to_dict())}


@dataclasses.dataclass(frozen=True)
class FinetuneMetrics(FinetuneSummary):
    """A finetune stage's metrics.json: its summary, and what the export reads besides."""

    majority_label: Optional[str] = output("the train set's most frequent label",
                                           optional=True)
    labels: Optional[list] = output("the label names, in the classifier's output order",
                                    optional=True)
    train_loss: Optional[float] = output("the last training window's loss", optional=True)
    initialised_from: Optional[str] = output("where the encoder's weights came from",
                                             optional=True)
    text_fields: Optional[list] = output("the task's text fields (runs that record them)",
                                         optional=True)
    max_seq_length: Optional[int] = output("its tokens per example (runs that record them)",
                                           optional=True)
