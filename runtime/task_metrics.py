"""The fine-tune metrics, computed as scikit-learn and SciPy compute them (the tests compare
them on the same predictions): accuracy, F1 of the positive class, Matthews correlation,
Pearson and Spearman correlation. The names and which task uses which are declared in
compiler/specs/task_kinds.py.

numpy only: no TensorFlow, no scikit-learn at run time.

Usage:
    score(["accuracy", "f1"], gold_ids, predicted_ids)   # {"accuracy": 0.8, "f1": 0.75}
    score(["pearson", "spearman"], gold_scores, predicted_scores)
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from runexp.compiler.specs.task_kinds import METRICS

POSITIVE_CLASS = 1  # F1's positive class: label id 1, scikit-learn's default pos_label


def accuracy(gold: np.ndarray, predicted: np.ndarray) -> float:
    """sklearn.metrics.accuracy_score (0.0 for no examples)."""
    return float(np.mean(gold == predicted)) if len(gold) else 0.0


def f1(gold: np.ndarray, predicted: np.ndarray) -> float:
    """sklearn.metrics.f1_score (binary, pos_label=1): 0.0 when there is neither a gold nor a
    predicted positive, as scikit-learn's zero_division default."""
    tp = int(np.sum((gold == POSITIVE_CLASS) & (predicted == POSITIVE_CLASS)))
    fp = int(np.sum((gold != POSITIVE_CLASS) & (predicted == POSITIVE_CLASS)))
    fn = int(np.sum((gold == POSITIVE_CLASS) & (predicted != POSITIVE_CLASS)))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def mcc(gold: np.ndarray, predicted: np.ndarray) -> float:
    """sklearn.metrics.matthews_corrcoef, its multiclass form (the binary one for two
    labels); 0.0 when either side is constant."""
    classes = np.union1d(gold, predicted)
    index = {c: i for i, c in enumerate(classes)}
    confusion = np.zeros((len(classes), len(classes)), np.float64)
    for g, p in zip(gold, predicted):
        confusion[index[g], index[p]] += 1
    true_sums, predicted_sums = confusion.sum(axis=1), confusion.sum(axis=0)
    n = confusion.sum()
    cov_true_predicted = np.trace(confusion) * n - true_sums @ predicted_sums
    cov_predicted = n * n - predicted_sums @ predicted_sums
    cov_true = n * n - true_sums @ true_sums
    if cov_predicted * cov_true == 0:
        return 0.0
    return float(cov_true_predicted / np.sqrt(cov_true * cov_predicted))


def pearson(gold: np.ndarray, predicted: np.ndarray) -> float:
    """scipy.stats.pearsonr's statistic; NaN (as SciPy) when either side is constant or
    there are fewer than two examples."""
    x, y = np.asarray(gold, np.float64), np.asarray(predicted, np.float64)
    if len(x) < 2:
        return float("nan")
    x, y = x - x.mean(), y - y.mean()
    norm = np.sqrt((x @ x) * (y @ y))
    return float(np.clip((x @ y) / norm, -1.0, 1.0)) if norm else float("nan")


def _ranks(values: np.ndarray) -> np.ndarray:
    """scipy.stats.rankdata(method="average"): ranks from 1, ties share their mean rank."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    # Each run of equal values gets the mean of the positions it spans.
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values), np.float64)
    for start, end in zip(starts, ends):
        ranks[order[start:end]] = (start + end + 1) / 2.0
    return ranks


def spearman(gold: np.ndarray, predicted: np.ndarray) -> float:
    """scipy.stats.spearmanr's statistic: Pearson correlation of the ranks (ties
    averaged); NaN when either side is constant."""
    x, y = np.asarray(gold, np.float64), np.asarray(predicted, np.float64)
    return pearson(_ranks(x), _ranks(y)) if len(x) >= 2 else float("nan")


COMPUTE: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy, "f1": f1, "mcc": mcc, "pearson": pearson, "spearman": spearman}
assert set(COMPUTE) == set(METRICS), "every declared metric has its computation"


def score(names: Sequence[str], gold, predicted) -> dict[str, float]:
    """The metrics ``names`` of predictions against gold (label ids, or float scores for
    regression metrics), in the order named."""
    gold, predicted = np.asarray(gold), np.asarray(predicted)
    if gold.shape != predicted.shape:
        raise ValueError(f"{len(gold)} gold values for {len(predicted)} predictions")
    return {name: COMPUTE[name](gold, predicted) for name in names}
