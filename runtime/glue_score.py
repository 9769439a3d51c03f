"""GLUE's score as its leaderboard computes it, from each task's dev-set metrics.

The rule (Wang et al., GLUE, and the leaderboard): a task with two metrics scores their
unweighted mean (MRPC and QQP: F1 and accuracy; STS-B: Pearson and Spearman correlation);
MNLI is one task whose score is the mean of its matched and mismatched accuracy; the GLUE
score is the unweighted mean of the task scores. Checked in tests on BERT-large's published
test scores: the rule gives the leaderboard's 80.5 (with WNLI's 65.1, as the leaderboard
counts it). runexp leaves WNLI out (compiler/glue_tasks.py), so its average is over the
other eight, or over those of them a suite runs; it says which.

Standard library only.

Usage:
    task_score({"matched": {"accuracy": 0.84}, "mismatched": {"accuracy": 0.83}},
               ["accuracy"])                                  # 0.835
    glue_average({"mnli": 0.835, "cola": 0.52})                # 0.6775
"""

from __future__ import annotations

from typing import Mapping, Sequence

RULE = ("each task's score is the mean of its metrics over its dev sets (MRPC, QQP: F1 and "
        "accuracy; STS-B: Pearson and Spearman; MNLI: matched and mismatched accuracy); the "
        "GLUE average is the mean of the task scores, as GLUE's leaderboard computes it; WNLI "
        "left out")


def task_score(dev_sets: Mapping[str, Mapping[str, float]], metrics: Sequence[str]) -> float:
    """The mean of ``metrics`` over every dev set: one number per task."""
    values = [float(scores[m]) for scores in dev_sets.values() for m in metrics]
    if not values:
        raise ValueError("a task score needs at least one dev set and one metric")
    return sum(values) / len(values)


def glue_average(task_scores: Mapping[str, float]) -> float:
    """The unweighted mean of the task scores."""
    if not task_scores:
        raise ValueError("no task scores to average")
    return sum(task_scores.values()) / len(task_scores)
